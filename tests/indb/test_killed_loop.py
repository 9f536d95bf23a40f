"""The in-database loop claims a batch and posts it one request at a time: when its backend
is terminated mid-batch, only the request in flight has spent its attempt."""

from __future__ import annotations

import threading

import psycopg

import pgmb
from pgmb import deliveries
from pgmb.db.conninfo import conninfo_from_django
from pgmb.models import Attempt, DeadLetter, Delivery
from tests.httpserver import held
from tests.waiting import wait_until


def test_a_terminated_loop_spends_the_attempt_in_flight_only(
    pg, transport, recording_server, make_worker, make_queue
):
    gate = threading.Event()
    recording_server.respond(held(gate))
    make_queue(
        "#",
        worker=make_worker(endpoint=recording_server.url(), timeout=60),
        max_retries=0,
        lease_seconds=600,
    )
    ids = {str(i) for i in pgmb.send_batch(("k", n) for n in range(5))}
    ended: list[BaseException] = []

    def loop() -> None:
        with psycopg.connect(**conninfo_from_django("default"), autocommit=True) as conn:
            try:
                conn.execute("CALL pgmb.dispatch_loop(60, 5)")
            except psycopg.OperationalError as exc:
                ended.append(exc)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        [first] = recording_server.wait_for(1)
        in_flight = first.headers["pgmb-message-id"]
        # Its start mark was committed before the request went out; the four claimed with
        # it are not marked.
        assert Delivery.objects.filter(state="leased").count() == 5
        marked = Delivery.objects.filter(started=True).values_list("message_id", flat=True)
        assert [str(m) for m in marked] == [in_flight]
        [(pid,)] = pg.execute(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'CALL pgmb.dispatch_loop%%'"
        ).fetchall()
        pg.execute("SELECT pg_terminate_backend(%s)", (pid,))
    finally:
        gate.set()
    thread.join(timeout=60)
    assert ended, "the loop's backend was not terminated"
    wait_until(
        lambda: not pg.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchall(),
        message="the terminated backend to exit",
    )
    assert len(recording_server.requests) == 1
    assert not Attempt.objects.exists()  # the outcome was never committed
    # The leases run out (600 s, brought forward).
    pg.execute("UPDATE pgmb_delivery SET available_at = now() WHERE state = 'leased'")
    assert deliveries.reclaim_expired() == 5
    assert [str(m) for m in DeadLetter.objects.values_list("message_id", flat=True)] == [in_flight]
    left = Delivery.objects.all()
    assert {str(d.message_id) for d in left} == ids - {in_flight}
    assert {(d.state, d.attempts, d.unsent_leases) for d in left} == {("ready", 0, 1)}
