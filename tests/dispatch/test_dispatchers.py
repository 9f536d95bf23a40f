"""Dispatchers register, heartbeat and stop, so an operator sees them (pgmb.dispatcher_registry):
the SQL rule, real pgmb_dispatch processes, and a heartbeat the database refuses."""

from __future__ import annotations

import datetime
import logging
import signal

from django.db import connection

import pgmb
from pgmb import dispatcher_registry
from pgmb.models import Delivery, DispatcherProcess
from tests.waiting import wait_until

FAST = {"PGMB_TEST_HEARTBEAT_INTERVAL": "0.2"}


def _info(pid: int) -> dispatcher_registry.DispatcherInfo | None:
    return next((d for d in dispatcher_registry.dispatchers() if d.pid == pid), None)


def test_state_running_gone_stopped_and_maintenance(db, sql):
    me = dispatcher_registry.start("external", "web-1", 4242, ["order_queue"])
    [info] = dispatcher_registry.dispatchers()
    assert (info.id, info.kind, info.host, info.pid, info.queues, info.state) == (
        me,
        "external",
        "web-1",
        4242,
        ["order_queue"],
        "running",
    )
    assert info.stopped_at is None and (info.in_flight, info.delivered, info.failed) == (0, 0, 0)
    # Gone once the last heartbeat is older than the threshold (60 s), not before.
    beat = info.heartbeat_at
    assert (
        dispatcher_registry.dispatchers(beat + datetime.timedelta(seconds=59))[0].state == "running"
    )
    assert dispatcher_registry.dispatchers(beat + datetime.timedelta(seconds=61))[0].state == "gone"
    assert dispatcher_registry.beat(me, 3, 10, 2)
    info = dispatcher_registry.dispatchers()[0]
    assert (info.in_flight, info.delivered, info.failed) == (3, 10, 2)
    assert info.heartbeat_at >= beat
    assert dispatcher_registry.stop(me, 12, 2)
    info = dispatcher_registry.dispatchers()[0]
    assert (info.state, info.in_flight, info.delivered, info.failed) == ("stopped", 0, 12, 2)
    assert info.stopped_at is not None
    assert not dispatcher_registry.beat(me, 0, 0, 0)  # a stopped one must register again
    assert not dispatcher_registry.stop(me)
    # The SQL view says the same.
    assert sql("SELECT state, delivered FROM pgmb.dispatchers WHERE id = %s", (me,)) == [
        ("stopped", 12)
    ]

    # Maintenance removes stopped and gone rows older than a day, nothing else.
    running = dispatcher_registry.start("external", "web-2", 1, None)
    old_gone = dispatcher_registry.start("external", "web-3", 2, None)
    quiet = dispatcher_registry.start("external", "web-4", 3, None)  # gone, but not for a day yet
    sql(
        "UPDATE pgmb_dispatcher SET heartbeat_at = now() - interval '2 days',"
        " stopped_at = now() - interval '2 days' WHERE id = %s",
        (me,),
    )
    sql(
        "UPDATE pgmb_dispatcher SET heartbeat_at = now() - interval '25 hours' WHERE id = %s",
        (old_gone,),
    )
    sql(
        "UPDATE pgmb_dispatcher SET heartbeat_at = now() - interval '2 hours' WHERE id = %s",
        (quiet,),
    )
    sql("SELECT pgmb.maintenance()")
    assert {d.id: d.state for d in dispatcher_registry.dispatchers()} == {
        running: "running",
        quiet: "gone",
    }


def test_a_dispatch_process_registers_beats_and_stops(
    spawn, recording_server, make_worker, make_queue
):
    queue = make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    proc = spawn("--queue", queue.name, "--poll-interval", "0.1", extra_env=FAST)
    info = wait_until(lambda: _info(proc.pid), message="the dispatcher to register")
    assert (info.kind, info.queues, info.state, info.stopped_at) == (
        "external",
        [queue.name],
        "running",
        None,
    )
    assert info.host
    pgmb.send_batch(("k", n) for n in range(20))
    info = wait_until(
        lambda: (i := _info(proc.pid)) and i.delivered >= 20 and i,
        message=lambda: f"its counters to show 20 deliveries ({_info(proc.pid)})",
    )
    assert info.state == "running" and info.failed == 0
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    info = _info(proc.pid)
    assert info is not None
    assert (info.state, info.delivered, info.in_flight) == ("stopped", 20, 0)
    assert info.stopped_at is not None


def test_a_killed_dispatcher_is_gone_once_its_heartbeat_is_old(spawn, make_queue, sql):
    make_queue("#")
    proc = spawn("--poll-interval", "0.1", extra_env=FAST)
    wait_until(lambda: _info(proc.pid), message="the dispatcher to register")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    info = _info(proc.pid)
    assert info is not None and info.state == "running"  # nobody can know yet
    # 61 s after its last heartbeat (more than the threshold) it is gone...
    later = info.heartbeat_at + datetime.timedelta(seconds=61)
    assert [d.state for d in dispatcher_registry.dispatchers(later) if d.pid == proc.pid] == [
        "gone"
    ]
    # ...and so it is now, once its last heartbeat is made that old.
    sql("UPDATE pgmb_dispatcher SET heartbeat_at = heartbeat_at - interval '61 seconds'")
    info = _info(proc.pid)
    assert info is not None and (info.state, info.stopped_at) == ("gone", None)


def test_a_refused_heartbeat_never_stops_the_dispatcher(
    dispatch, recording_server, make_worker, make_queue, caplog
):
    """The database refuses every registration (as if not migrated): it delivers anyway."""
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE pgmb_dispatcher ADD CONSTRAINT refuse_all CHECK (false) NOT VALID"
        )
    try:
        pgmb.send_batch(("k", n) for n in range(10))
        with caplog.at_level(logging.ERROR, logger="pgmb.dispatch"):
            stats = dispatch()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pgmb_dispatcher DROP CONSTRAINT refuse_all")
    assert stats.delivered == 10
    assert not Delivery.objects.exists()
    assert "could not record a heartbeat" in caplog.text
    assert not DispatcherProcess.objects.exists()


def test_an_in_process_dispatcher_registers_and_stops(dispatch, make_queue):
    make_queue("#", max_retries=0)
    pgmb.send("k", 1)  # to port 9: a failure, counted
    stats = dispatch(max_seconds=60)
    [row] = DispatcherProcess.objects.all()
    assert row.stopped_at is not None and row.kind == "external"
    assert (row.delivered, row.failed) == (stats.delivered, stats.failed)
