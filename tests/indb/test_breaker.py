"""The circuit breaker with the in-database loop: the same SQL opens it, holds the
worker's deliveries, probes and closes it, against a real endpoint on loopback."""

from __future__ import annotations

import pgmb
from pgmb.models import Attempt, Delivery, Worker


def test_the_loop_opens_the_breaker_holds_back_then_probes_and_closes_it(
    transport, dispatch_until, recording_server, make_worker, make_queue
):
    recording_server.respond(500)
    worker = make_worker(
        endpoint=recording_server.url("/in-db"),
        breaker_failures=3,
        breaker_cooldown=0.5,
        breaker_cooldown_max=0.5,
    )
    make_queue("#", worker=worker, backoff_base=0.1, backoff_max=0.2)
    pgmb.send_batch([("k", n) for n in range(200)])

    dispatch_until(
        lambda: Worker.objects.get(pk=worker.pk).breaker_state == "open",
        "the breaker to open",
        seconds=0.5,
    )
    reason = Worker.objects.get(pk=worker.pk).breaker_reason
    assert reason.startswith(("3 failures in a row (last: HTTP 500", "the probe failed (HTTP 500"))
    tried = Attempt.objects.count()
    assert tried < 200  # what one claim (a batch of 50) took went out
    assert Delivery.objects.filter(attempts=0).count() == 200 - tried

    recording_server.respond(200)  # the endpoint recovers
    dispatch_until(lambda: not Delivery.objects.exists(), "all 200 messages to be delivered")
    assert Attempt.objects.filter(outcome="ack").count() == 200
    closed = Worker.objects.get(pk=worker.pk)
    assert (closed.breaker_state, closed.breaker_reason) == (
        "closed",
        "the probe succeeded (HTTP 200)",
    )
