"""The in-database loop registers as a dispatcher, beats, and marks itself stopped."""

from __future__ import annotations

import threading

import pgmb
from pgmb import dispatcher_registry
from pgmb.db.conninfo import conninfo_from_django
from pgmb.models import Delivery, DispatcherProcess
from tests.waiting import wait_until


def test_the_loop_registers_and_stops(pg, transport, recording_server, make_worker, make_queue):
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    pgmb.send_batch(("k", n) for n in range(3))
    [(backend,)] = pg.execute("SELECT pg_backend_pid()").fetchall()
    pg.execute("CALL pgmb.dispatch_loop(0.5, 50)")
    assert not Delivery.objects.exists()
    [info] = [d for d in dispatcher_registry.dispatchers() if d.pid == backend]
    assert (info.kind, info.pid, info.queues, info.state) == (
        "in_database",
        backend,
        None,
        "stopped",
    )
    assert (info.delivered, info.failed, info.in_flight) == (3, 0, 0)
    # The next run of a scheduled loop replaces its predecessor's stopped row.
    pg.execute("CALL pgmb.dispatch_loop(0.1, 50)")
    [again] = [d for d in dispatcher_registry.dispatchers() if d.pid == backend]
    assert again.id != info.id and again.state == "stopped" and again.delivered == 0


def test_the_loop_is_running_while_it_runs(pg, transport, make_queue):
    make_queue("#")
    done = threading.Event()

    def loop() -> None:
        import psycopg

        with psycopg.connect(**conninfo_from_django("default"), autocommit=True) as conn:
            try:
                conn.execute("CALL pgmb.dispatch_loop(30, 50, ARRAY['nothing_here'])")
            except psycopg.errors.QueryCanceled:
                return
        done.set()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    info = wait_until(
        lambda: next(
            (d for d in dispatcher_registry.dispatchers() if d.queues == ["nothing_here"]), None
        ),
        message="the loop to register",
    )
    assert (info.kind, info.queues, info.state) == ("in_database", ["nothing_here"], "running")
    # Ended from outside (as a cancelled job would be): left running, then gone in time.
    pg.execute("SELECT pg_cancel_backend(%s)", (info.pid,))
    thread.join(timeout=60)
    assert not done.is_set()
    row = DispatcherProcess.objects.get(pk=info.id)
    assert row.stopped_at is None
