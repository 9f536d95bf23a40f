"""A cap on requests in flight across both dispatch paths at once: three pgmb_dispatch
processes (--concurrency 32 each) and the in-database loop deliver for one worker capped at
2, whose endpoint holds every request until the test lets it go."""

from __future__ import annotations

import signal
import threading
from collections import Counter

import pgmb
from pgmb.models import Delivery, DispatcherProcess
from tests.httpserver import held
from tests.waiting import wait_until


def _leased() -> int:
    return Delivery.objects.filter(state="leased").count()


def test_three_dispatchers_and_the_loop_keep_to_the_cap(
    pg, transport, start_loop, manage_process, recording_server, make_worker, make_queue
):
    n = 24
    # Each request is answered only when the test sets its gate (the i-th to arrive, the
    # i-th gate): the endpoint never answers on its own, so the cap alone keeps the rest out.
    gates = [threading.Event() for _ in range(n)]
    recording_server.script(held(gate) for gate in gates)
    worker = make_worker(endpoint=recording_server.url(), max_in_flight=2, timeout=20)
    make_queue("#", worker=worker, lease_seconds=120)
    procs = [
        manage_process("pgmb_dispatch", "--concurrency", "32", "--poll-interval", "0.2")
        for _ in range(3)
    ]
    start_loop(seconds=600, batch=10)
    running = DispatcherProcess.objects.filter(stopped_at=None)
    wait_until(
        lambda: (
            (running.filter(kind="external").count(), running.filter(kind="in_database").count())
            == (3, 1)
        ),
        message="three dispatchers and the loop to start",
    )
    ids = pgmb.send_batch(("k", i) for i in range(n))
    try:
        for i in range(n):
            # Request i is in flight, and the worker's slots are all taken (by requests in
            # flight or claimed to be posted next) before it is let go: every dispatcher
            # has had its chance to send one more.
            wait_until(
                lambda i=i: len(recording_server.requests) > i and _leased() == min(2, n - i),
                message=lambda i=i: (
                    f"request {i} and the worker's slots taken "
                    f"({len(recording_server.requests)} arrived, {_leased()} leased)"
                ),
            )
            assert recording_server.in_flight <= 2
            gates[i].set()
        wait_until(lambda: not Delivery.objects.exists(), message="every delivery acked")
    finally:
        for gate in gates:
            gate.set()
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert recording_server.max_in_flight == 2
    counts = Counter(r.headers["pgmb-message-id"] for r in recording_server.requests)
    assert set(counts) == {str(i) for i in ids}
    assert set(counts.values()) == {1}
