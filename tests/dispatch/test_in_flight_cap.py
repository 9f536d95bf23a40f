"""A cap on requests in flight and a crash: a killed dispatcher's slots come back when its
leases run out, and not before."""

from __future__ import annotations

import threading
from collections import Counter

import pgmb
from pgmb.models import Attempt, Delivery
from tests.httpserver import held
from tests.waiting import wait_until


def test_a_killed_dispatchers_slots_come_back_with_its_leases(
    spawn, sql, recording_server, make_worker, make_queue
):
    gates = [threading.Event(), threading.Event()]
    recording_server.script(held(gate) for gate in gates)  # then 200 at once
    worker = make_worker(endpoint=recording_server.url(), max_in_flight=2, timeout=5)
    make_queue("#", worker=worker, lease_seconds=6, backoff_base=0.1)
    ids = pgmb.send_batch(("k", i) for i in range(8))
    victim = spawn("--concurrency", "32")
    recording_server.wait_for(2)
    victim.kill()
    victim.wait(timeout=30)
    for gate in gates:  # answered to nobody: the endpoint is free, the slots are not
        gate.set()
    wait_until(lambda: recording_server.in_flight == 0, message="the held requests answered")
    [(leased, slots_back_at)] = sql(
        "SELECT count(*), extract(epoch FROM min(available_at))::float8"
        " FROM pgmb_delivery WHERE state = 'leased'"
    )
    assert leased == 2  # the victim died holding both slots
    rescuer = spawn("--until-idle", "--concurrency", "32", "--poll-interval", "0.1")
    assert rescuer.wait(timeout=120) == 0, rescuer.stderr.read()
    after = recording_server.requests[2:]
    # Nothing was posted while the dead dispatcher's leases held the slots.
    assert min(r.received_wall for r in after) >= slots_back_at
    assert recording_server.max_in_flight == 2
    counts = Counter(r.headers["pgmb-message-id"] for r in recording_server.requests)
    assert set(counts) == {str(i) for i in ids}
    assert not Delivery.objects.exists()
    # The two leases of the crash ran out: counted if marked started by then, else not.
    assert Attempt.objects.filter(outcome__in=("expired", "unsent")).count() == 2
