"""Fair shares per key in the in-database loop (pgmb.loop_claim claims through pgmb.claim):
a late tenant's messages reach a real HTTP server on loopback among the first ones, through
both transports (docs/fairness.md)."""

from __future__ import annotations

from collections import Counter

import pgmb
from pgmb.models import Delivery


def test_the_loop_takes_a_late_tenant_in_turn(
    transport, dispatch_until, make_recording_server, make_worker, make_queue, sql
):
    server = make_recording_server()
    worker = make_worker(endpoint=server.url(), rps=100_000)
    queue = make_queue("#", worker=worker, max_retries=0)
    sql("SELECT pgmb.fairness(%s, 'tenant')", (queue.name,))
    pgmb.send_batch(
        pgmb.Outgoing("job", {"tenant": "a", "n": n}, headers={"tenant": "a"}) for n in range(1000)
    )
    pgmb.send_batch(
        pgmb.Outgoing("job", {"tenant": "b", "n": n}, headers={"tenant": "b"}) for n in range(5)
    )
    dispatch_until(lambda: not Delivery.objects.exists(), "every delivery posted", seconds=2.0)
    order = [r.json()["tenant"] for r in server.requests]
    assert Counter(order) == {"a": 1000, "b": 5}
    b_at = [i for i, tenant in enumerate(order) if tenant == "b"]
    assert max(b_at) < 150, b_at
