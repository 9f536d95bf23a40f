"""Schedules fired by whichever runs: three ``pgmb_dispatch`` processes and the in-database
loop at once fire each due time of a 1 s schedule exactly once; a dispatcher killed in the
middle of a fire (its publish done, its advance not committed) loses no due time and
causes none to fire twice. The assertions are on the messages stored: one per due time,
from the first on, none missing, none twice."""

from __future__ import annotations

import datetime
import uuid

import psycopg
import pytest

from pgmb import schedules
from tests.waiting import wait_until


def _needs_transport(pg: psycopg.Connection) -> None:
    if pg.execute("SELECT pgmb.http_transport()").fetchone()[0] is None:
        pytest.skip("no transport for the in-database loop (http extension or plpython3u)")


def _every_second(pg: psycopg.Connection, name: str, key: str) -> tuple[int, datetime.datetime]:
    sid = pg.execute(
        "SELECT pgmb.schedule(name => %s, routing_key => %s, body => '{}',"
        " every => interval '1 second', missed => 'all', first_run => now() + interval '1 second')",
        (name, key),
    ).fetchone()[0]
    first = pg.execute("SELECT next_run_at FROM pgmb_schedule WHERE id = %s", (sid,)).fetchone()[0]
    return sid, first


def _runs(pg: psycopg.Connection, sid: int) -> int:
    return pg.execute("SELECT runs FROM pgmb_schedule WHERE id = %s", (sid,)).fetchone()[0]


def _check_each_due_time_once(
    pg: psycopg.Connection, sid: int, first: datetime.datetime, key: str
) -> int:
    """Paused (which waits for a fire holding the row), then: the messages of ``key`` are
    exactly the due times first, first + 1 s, ... as many as the schedule counted."""
    pg.execute("SELECT pgmb.pause_schedule(%s)", (f"{key}-schedule",))
    ids = [
        row[0]
        for row in pg.execute(
            "SELECT id FROM pgmb_message WHERE routing_key = %s ORDER BY id", (key,)
        ).fetchall()
    ]
    runs = _runs(pg, sid)
    due_times = [first + datetime.timedelta(seconds=n) for n in range(len(ids))]
    assert ids == [schedules.message_id(sid, due) for due in due_times]
    assert len(ids) == runs
    assert len(set(ids)) == len(ids)
    assert all(isinstance(i, uuid.UUID) for i in ids)
    return runs


def test_three_dispatchers_and_the_loop_fire_each_due_time_once(pg, start_loop, manage_process):
    _needs_transport(pg)
    key = "sched.race"
    sid, first = _every_second(pg, f"{key}-schedule", key)
    procs = [manage_process("pgmb_dispatch", "--poll-interval", "0.3") for _ in range(3)]
    start_loop(seconds=300)
    wait_until(lambda: _runs(pg, sid) >= 8, message="eight due times fired")
    assert all(p.poll() is None for p in procs)
    assert _check_each_due_time_once(pg, sid, first, key) >= 8


def test_a_dispatcher_killed_mid_fire_loses_no_run_and_fires_none_twice(pg, manage_process):
    """The first message the schedule publishes stops its firer inside the publish (a
    trigger sleeps once: a sequence counts, which a rollback does not undo); that
    dispatcher is killed and its session ended, so its publish is rolled back with its
    advance. Two other dispatchers fire the due time it held, and the rest."""
    key = "sched.killed"
    pg.execute("CREATE SEQUENCE IF NOT EXISTS test_schedule_fault")
    pg.execute(
        "CREATE OR REPLACE FUNCTION test_schedule_fault() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN IF nextval('test_schedule_fault') = 1 THEN PERFORM pg_sleep(120); END IF;"
        " RETURN NULL; END $$"
    )
    pg.execute(
        "CREATE TRIGGER test_schedule_fault AFTER INSERT ON pgmb_message FOR EACH ROW"
        f" WHEN (NEW.routing_key = '{key}') EXECUTE FUNCTION test_schedule_fault()"
    )
    try:
        sid, first = _every_second(pg, f"{key}-schedule", key)
        victim = manage_process("pgmb_dispatch", "--poll-interval", "0.3")
        [(pid,)] = wait_until(
            lambda: pg.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
                " AND query LIKE '%%fire_due_schedules%%'"
            ).fetchall(),
            message="the first fire stopped inside its publish",
        )
        others = [manage_process("pgmb_dispatch", "--poll-interval", "0.3") for _ in range(2)]
        victim.kill()
        pg.execute("SELECT pg_terminate_backend(%s)", (pid,))
        wait_until(lambda: _runs(pg, sid) >= 5, message="five due times fired by the others")
        assert all(p.poll() is None for p in others)
        _check_each_due_time_once(pg, sid, first, key)
    finally:
        pg.execute("DROP TRIGGER IF EXISTS test_schedule_fault ON pgmb_message")
        pg.execute("DROP FUNCTION IF EXISTS test_schedule_fault()")
        pg.execute("DROP SEQUENCE IF EXISTS test_schedule_fault")
