"""pgmb through a real PgBouncer in transaction mode (the fixture ``pgbouncer``): the
dispatcher, a consumer and the Tasks worker deliver everything with no error, and leave
nothing on the server connections the pooler shares (settings, prepared statements,
LISTEN, advisory locks)."""

from __future__ import annotations

import json
import signal
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, connections
from django_tasks import TaskResultStatus

import pgmb
from pgmb.db import pooler
from pgmb.db.conninfo import conninfo_from_django
from pgmb.models import Delivery, Queue
from tests.pooler.conftest import POOL_SIZE, Bouncer
from tests.processes import StderrLines
from tests.tasks import jobs
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

#: What every process must say at start-up through the pooler.
POLLING = "LISTEN is unavailable there"
#: Lines no process may write: a statement meeting another client's on a shared server
#: connection, a traceback, anything logged as an error (an engine restarted is).
FAULTS = ("prepared statement", "DuplicatePreparedStatement", "bind message", "Traceback")


def _pooled_conninfo(bouncer: Bouncer) -> dict:
    return {**conninfo_from_django("default"), "port": bouncer.port}


def _faults(lines: list[str]) -> list[str]:
    return [line for line in lines if " ERROR " in line or any(f in line for f in FAULTS)]


def _left_behind(bouncer: Bouncer) -> list[tuple]:
    """What each server connection of the pool holds, seen by plain clients: each in a
    transaction of its own, so that together they hold every server connection."""
    clients = [
        psycopg.connect(**bouncer.conninfo(connection.settings_dict["NAME"]))
        for _ in range(POOL_SIZE)
    ]
    try:
        rows = [
            client.execute(
                "SELECT pg_backend_pid(), current_setting('synchronous_commit'),"
                " current_setting('lock_timeout'),"
                " (SELECT count(*) FROM pg_listening_channels()),"
                " (SELECT count(*) FROM pg_prepared_statements)"
            ).fetchone()
            for client in clients
        ]
    finally:
        for client in clients:
            client.close()
    assert len({row[0] for row in rows}) == POOL_SIZE, rows  # every server connection seen
    return [row[1:] for row in rows]


def _advisory_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
        return cursor.fetchone()[0]


def _finished(result) -> bool:
    result.refresh()
    return result.is_finished


def _marks() -> dict:
    """How many running dispatchers and consumers are marked waiting (True), not (False),
    or have not said (None: publishers NOTIFY then too)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT waiting, count(*) FROM pgmb_dispatcher WHERE stopped_at IS NULL GROUP BY 1"
        )
        return dict(cursor.fetchall())


def test_conninfo_keeps_the_prepare_threshold_options_give(monkeypatch):
    settings = connections["default"].settings_dict
    monkeypatch.setitem(settings, "OPTIONS", {**settings["OPTIONS"], "prepare_threshold": None})
    with psycopg.connect(**conninfo_from_django("default")) as conn:
        assert conn.prepare_threshold is None
    monkeypatch.setitem(settings, "OPTIONS", {**settings["OPTIONS"], "prepare_threshold": 2})
    with psycopg.connect(**conninfo_from_django("default")) as conn:
        assert conn.prepare_threshold == 2


def test_a_connection_through_pgbouncer_is_known_as_pooled(pgbouncer, monkeypatch):
    direct = pooler.connect(conninfo_from_django("default"))
    through = pooler.connect(_pooled_conninfo(pgbouncer))
    other = pooler.connect(_pooled_conninfo(pgbouncer))
    try:
        assert (direct.pooled, through.pooled) == (False, True)
        # psycopg's default where nothing is shared; none through the pooler.
        assert (direct.prepare_threshold, through.prepare_threshold) == (5, None)
        # Two clients running the same statements in turn on shared server connections.
        for n in range(20):
            for conn in (through, other):
                assert conn.execute("SELECT %s::int + 1", [n]).fetchone() == (n + 1,)
    finally:
        for conn in (direct, through, other):
            conn.close()
    # A threshold the options name is kept, pooler or not (PgBouncer 1.21+ can track them).
    settings = connections["default"].settings_dict
    monkeypatch.setitem(settings, "OPTIONS", {**settings["OPTIONS"], "prepare_threshold": 3})
    with pooler.connect(_pooled_conninfo(pgbouncer)) as conn:
        assert conn.pooled and conn.prepare_threshold == 3


def test_dispatch_pull_and_tasks_through_pgbouncer(
    pgbouncer, manage_process, recording_server, make_worker, make_queue, tmp_path
):
    make_queue("push.#", worker=make_worker(endpoint=recording_server.url()))
    pull = Queue.objects.create(name="pulled", binding_key="pull.#", worker=None)
    call_command("pgmb_tasks_worker", "--create-queues", stdout=StringIO())
    out = tmp_path / "consumed.jsonl"
    through = {"PGPORT": str(pgbouncer.port), "PGMB_CONSUME_OUT": str(out)}
    dispatcher = manage_process("pgmb_dispatch", "--poll-interval", "0.1", env=through)
    consumer = manage_process(
        "pgmb_consume",
        pull.name,
        "--handler",
        "tests.pull.handlers.record",
        "--poll-interval",
        "0.1",
        "--max-messages",
        "30",
        env=through,
    )
    worker = manage_process("pgmb_tasks_worker", env=through)
    logs = {proc: StderrLines(proc) for proc in (dispatcher, consumer, worker)}
    for proc, lines in logs.items():
        wait_until(
            lambda lines=lines: lines.has(POLLING),
            message=lambda proc=proc, lines=lines: f"{proc.args} to say so: {lines.lines}",
        )

    # None of them says it waits for a NOTIFY (publishers would send one for nothing):
    # the dispatcher and the three consumers (one, and the worker's two).
    wait_until(
        lambda: _marks() == {False: 4},
        message=lambda: f"every process to say it does not wait ({_marks()})",
    )
    # Published once all three poll: no NOTIFY wakes them, the poll does.
    pgmb.send_batch(("push.x", {"n": n}) for n in range(150))
    pgmb.send_batch(("pull.x", {"n": n}) for n in range(30))
    results = [jobs.add.enqueue(n, 1) for n in range(10)]

    wait_until(
        lambda: len({r.headers["pgmb-message-id"] for r in recording_server.requests}) >= 150,
        message=lambda: f"150 deliveries ({len(recording_server.requests)})",
    )
    assert consumer.wait(timeout=60) == 0, logs[consumer].lines
    for result in results:
        wait_until(lambda result=result: _finished(result), message="the tasks")
        assert result.status == TaskResultStatus.SUCCESSFUL
    assert sorted(r.return_value for r in results) == list(range(1, 11))
    for proc in (dispatcher, worker):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, logs[proc].lines

    bodies = sorted(json.loads(r.body)["n"] for r in recording_server.requests)
    assert bodies == list(range(150))  # each once
    consumed = [json.loads(line)["body"]["n"] for line in out.read_text().splitlines()]
    assert sorted(consumed) == list(range(30))
    assert not Delivery.objects.exists()
    for proc, lines in logs.items():
        assert _faults(lines.lines) == [], proc.args
    # Nothing outlived its transaction on the server connections the pooler shares.
    assert _left_behind(pgbouncer) == [("on", "0", 0, 0)] * POOL_SIZE
    assert _advisory_locks() == 0


def test_housekeeping_through_pgbouncer_is_refused_and_leaves_nothing(pgbouncer, manage_process):
    through = {"PGPORT": str(pgbouncer.port)}
    proc = manage_process("pgmb_housekeeping", env=through)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out, err)
    assert "housekeeping needs a direct connection to PostgreSQL" in err
    assert "--database" in err
    # A dry run only reads: it is answered.
    proc = manage_process("pgmb_housekeeping", "--dry-run", env=through)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, err)
    assert "pgmb_delivery:" in out
    assert _left_behind(pgbouncer) == [("on", "0", 0, 0)] * POOL_SIZE
    assert _advisory_locks() == 0


def test_housekeeping_still_runs_directly(manage_process):
    proc = manage_process("pgmb_housekeeping")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, err)
    assert "no index to rebuild" in out


def _listening_and_waiting() -> tuple[int, int]:
    """Connections that LISTEN (directly: none goes through the pooler), and registered
    processes marked waiting (publishers then NOTIFY)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN pgmb%%'"
            "         AND datname = current_database()),"
            "       (SELECT count(*) FROM pgmb_dispatcher WHERE stopped_at IS NULL AND waiting)"
        )
        return cursor.fetchone()


def test_through_pgbouncer_a_direct_alias_listens_and_housekeeps(
    pgbouncer, manage_process, recording_server, make_worker, make_queue, tmp_path
):
    make_queue("push.#", worker=make_worker(endpoint=recording_server.url()))
    pull = Queue.objects.create(name="pulled", binding_key="pull.#", worker=None)
    out = tmp_path / "consumed.jsonl"
    # PGMB["DIRECT_DATABASES"] = {"default": "direct"}, "direct" the cluster itself.
    through = {
        "PGPORT": str(pgbouncer.port),
        "PGMB_TEST_DIRECT_PORT": connection.settings_dict["PORT"],
        "PGMB_CONSUME_OUT": str(out),
    }
    # Polls an hour apart: only a NOTIFY can wake them.
    dispatcher = manage_process("pgmb_dispatch", "--poll-interval", "3600", env=through)
    consumer = manage_process(
        "pgmb_consume",
        pull.name,
        "--handler",
        "tests.pull.handlers.record",
        "--poll-interval",
        "3600",
        "--max-messages",
        "2",
        env=through,
    )
    logs = {proc: StderrLines(proc) for proc in (dispatcher, consumer)}
    wait_until(
        lambda: _listening_and_waiting() >= (2, 2),
        message=lambda: f"both to listen and wait ({_listening_and_waiting()}, {logs})",
    )
    pgmb.send("push.x", {"n": 1})
    pgmb.send("pull.x", {"n": 2})
    pgmb.send("pull.x", {"n": 3})
    wait_until(lambda: recording_server.requests, message="the push delivery")
    assert consumer.wait(timeout=60) == 0, logs[consumer].lines
    dispatcher.send_signal(signal.SIGTERM)
    assert dispatcher.wait(timeout=60) == 0, logs[dispatcher].lines
    assert [json.loads(r.body) for r in recording_server.requests] == [{"n": 1}]
    consumed = sorted(json.loads(line)["body"]["n"] for line in out.read_text().splitlines())
    assert consumed == [2, 3]
    for proc, lines in logs.items():
        assert _faults(lines.lines) == [], proc.args
        assert not lines.has(POLLING), proc.args

    # Housekeeping through the pooled alias goes to the direct one.
    proc = manage_process("pgmb_housekeeping", env=through)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, (stdout, stderr)
    assert "no index to rebuild" in stdout
    assert _left_behind(pgbouncer) == [("on", "0", 0, 0)] * POOL_SIZE
    assert _advisory_locks() == 0


def test_a_consumer_listens_again_once_its_direct_connection_is_lost(
    pgbouncer, manage_process, tmp_path
):
    pull = Queue.objects.create(name="pulled", binding_key="pull.#", worker=None)
    out = tmp_path / "consumed.jsonl"
    through = {
        "PGPORT": str(pgbouncer.port),
        "PGMB_TEST_DIRECT_PORT": connection.settings_dict["PORT"],
        "PGMB_CONSUME_OUT": str(out),
    }
    consumer = manage_process(
        "pgmb_consume",
        pull.name,
        "--handler",
        "tests.pull.handlers.record",
        "--poll-interval",
        "3600",
        "--max-messages",
        "1",
        env=through,
    )
    lines = StderrLines(consumer)
    wait_until(lambda: _listening_and_waiting() >= (1, 1), message="the consumer to listen")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE query LIKE 'LISTEN pgmb%%' AND datname = current_database()"
        )
    wait_until(lambda: lines.has("reconnected to the database"), message=lambda: lines.lines)
    # Its first registration is left to age into "gone"; the second one waits too.
    wait_until(lambda: _listening_and_waiting() >= (1, 2), message="the consumer to listen")
    pgmb.send("pull.x", {"n": 7})
    assert consumer.wait(timeout=60) == 0, lines.lines
    assert [json.loads(line)["body"]["n"] for line in out.read_text().splitlines()] == [7]
    assert _faults(lines.lines) == []
