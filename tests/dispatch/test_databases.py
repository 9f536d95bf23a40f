"""One ``pgmb_dispatch`` process serving two databases (``--database`` repeated): each
with its own workers, queues, state machine, rate limits and registration, and a fault in
one (gone away, not migrated) never stopping the other's deliveries.

The second database is the alias ``second`` of tests/settings.py, a database of its own on
the same server; only the tests that ask for it here make pytest-django create it.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from psycopg import sql

import pgmb
from pgmb.db.conninfo import conninfo_from_django
from pgmb.models import Attempt, DeadLetter, Delivery, DispatcherProcess, Queue, Worker
from tests.dispatch.test_processes import _watch
from tests.httpserver import reply
from tests.processes import ROOT
from tests.waiting import wait_until

SECOND = "second"
BOTH = ("--database", "default", "--database", SECOND)
both_databases = pytest.mark.django_db(transaction=True, databases=["default", SECOND])
_names = itertools.count(1)


def _queue(using: str, endpoint: str, binding: str = "#", *, worker_id=None, rps=100_000, **kw):
    """A queue and its worker in database ``using``."""
    worker = Worker.objects.using(using).create(
        id=worker_id or uuid.uuid4(), name=f"hook_{next(_names)}", endpoint=endpoint, rps=rps
    )
    return Queue.objects.using(using).create(
        name=kw.pop("name", f"queue_{next(_names)}"), binding_key=binding, worker=worker, **kw
    )


def _ids(server, path: str = "/") -> set[str]:
    return {r.headers["pgmb-message-id"] for r in server.requests if r.path == path}


@contextmanager
def _superuser() -> Iterator[psycopg.Connection]:
    with psycopg.connect(**conninfo_from_django("default"), autocommit=True) as conn:
        yield conn


@contextmanager
def _closed_to_connections(alias: str) -> Iterator[None]:
    """The database of ``alias`` refuses connections and its sessions are ended, as if its
    server went away (the other database, on the same server, is untouched); back after."""
    name = connections[alias].settings_dict["NAME"]
    connections[alias].close()
    with _superuser() as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(name))
        )
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name]
        )
    try:
        yield
    finally:
        with _superuser() as conn:
            conn.execute(
                sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(sql.Identifier(name))
            )


@both_databases
def test_two_databases_served_by_one_dispatcher(spawn, make_recording_server):
    server_a, server_b = make_recording_server(), make_recording_server()
    server_b.respond(500, path="/down")
    # The same queue name in both databases: each is its own world.
    _queue("default", server_a.url(), "order.#", name="orders")
    _queue(SECOND, server_b.url(), "order.#", name="orders")
    _queue(SECOND, server_b.url("/down"), "order.#", name="audit", max_retries=0)
    ids_a = {str(i) for i in pgmb.send_batch(("order.a", n) for n in range(30))}
    ids_b = {str(i) for i in pgmb.send_batch((("order.b", n) for n in range(30)), using=SECOND)}

    proc = spawn(*BOTH, "--until-idle")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err

    assert _ids(server_a) == ids_a
    assert _ids(server_b) == ids_b
    assert _ids(server_b, "/down") == ids_b
    assert not server_a.requests or {r.path for r in server_a.requests} == {"/"}
    for alias in ("default", SECOND):
        assert not Delivery.objects.using(alias).exists(), alias
    # Each database's state machine recorded its own outcomes: the dead letters are the second's.
    assert not DeadLetter.objects.using("default").exists()
    assert DeadLetter.objects.using(SECOND).filter(queue__name="audit").count() == 30
    assert Counter(Attempt.objects.using("default").values_list("outcome", flat=True)) == {
        "ack": 30
    }
    assert Counter(Attempt.objects.using(SECOND).values_list("outcome", flat=True)) == {
        "ack": 30,
        "dead": 30,
    }
    # Registered in each database's own table, and stopped there with its own counts.
    [in_a] = DispatcherProcess.objects.using("default").filter(pid=proc.pid)
    [in_b] = DispatcherProcess.objects.using(SECOND).filter(pid=proc.pid)
    assert (in_a.delivered, in_a.failed) == (30, 0) and in_a.stopped_at is not None
    assert (in_b.delivered, in_b.failed) == (30, 30) and in_b.stopped_at is not None
    # A summary line per database; log lines say which database they are about.
    assert "database=default claimed=30 delivered=30 failed=0" in out
    assert "database=second claimed=60 delivered=30 failed=30" in out
    assert "[default] registered as dispatcher" in err
    assert "[second] registered as dispatcher" in err
    assert "[second] dead-lettered queue=audit" in err
    assert "[default] dead-lettered" not in err


@both_databases
def test_each_database_keeps_its_own_rate_limits(spawn, make_recording_server):
    """One worker id in both databases: limited to 1 request a second in one, unlimited in
    the other. The slow one keeps to its own bucket; the fast one does not wait for it."""
    slow, fast = make_recording_server(), make_recording_server()
    worker_id = uuid.uuid4()
    opened = time.monotonic()  # before the slow worker's bucket exists: a looser bound
    _queue("default", slow.url(), worker_id=worker_id, rps=1)
    _queue(SECOND, fast.url(), worker_id=worker_id, rps=100_000)
    pgmb.send_batch(("k", n) for n in range(20))
    ids = {str(i) for i in pgmb.send_batch((("k", n) for n in range(200)), using=SECOND)}

    proc = spawn(*BOTH, "--concurrency", "16")
    fast.wait_for(200)
    slow_by_then = len(slow.requests)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()

    assert _ids(fast) == ids
    assert slow_by_then < 20  # the fast database's 200 did not wait for the slow one's pace
    rps, burst = 1, 1  # the bucket holds at least one token
    for count, at in enumerate(sorted(r.received_at for r in slow.requests), start=1):
        assert count <= burst + rps * (at - opened) + 1, f"request {count} at {at - opened:.2f}s"


def _command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "django", "pgmb_dispatch", *args],
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PGMB_DB_NAME": connections["default"].settings_dict["NAME"],
            "PGMB_SECOND_DB_NAME": connections[SECOND].settings_dict["NAME"],
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--database", "nowhere"], "--database 'nowhere' is not in settings.DATABASES"),
        (
            ["--database", "default", "--database", "nowhere"],
            "--database 'nowhere' is not in settings.DATABASES",
        ),
        (["--database", "lite"], "--database 'lite' is sqlite, not PostgreSQL"),
        (["--database", "default", "--database", "default"], "--database given twice: 'default'"),
    ],
)
def test_a_database_pgmb_cannot_serve_is_refused_before_anything_starts(
    transactional_db, args, error
):
    result = _command(*args, "--until-idle")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"CommandError: {error}"), result.stderr
    assert not DispatcherProcess.objects.exists()  # nothing started, not even the good one


@both_databases
def test_a_queue_filter_names_a_queue_of_any_database_served(transactional_db):
    _queue(SECOND, "http://127.0.0.1:9/", name="only_in_second")
    out = StringIO()
    call_command("pgmb_dispatch", *BOTH, "--queue", "only_in_second", "--until-idle", stdout=out)
    assert "database=second claimed=0" in out.getvalue()
    with pytest.raises(CommandError, match=r"^unknown queue\(s\): only_in_second$"):
        call_command("pgmb_dispatch", "--queue", "only_in_second", "--until-idle")
    result = _command(*BOTH, "--queue", "only_in_second", "--queue", "nowhere", "--until-idle")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == "CommandError: unknown queue(s) (in none of the databases served): nowhere"
    assert DispatcherProcess.objects.using(SECOND).count() == 1  # the first run's only


@both_databases
def test_a_database_that_goes_away_and_comes_back_never_stops_the_other(
    spawn, make_recording_server
):
    server_a, server_b = make_recording_server(), make_recording_server()
    _queue("default", server_a.url())
    _queue(SECOND, server_b.url())
    # Heartbeats every 0.2 s: some fall in the outage, and must not end anything.
    proc = spawn(*BOTH, "--poll-interval", "0.2", extra_env={"PGMB_TEST_HEARTBEAT_INTERVAL": "0.2"})
    stderr, reader = _watch(proc.stderr)
    pgmb.send("k", "before", using=SECOND)
    server_b.wait_for(1)

    with _closed_to_connections(SECOND):
        wait_until(
            lambda: any("[second] database unavailable" in line for line in stderr),
            message="the dispatcher to report the second database unavailable",
        )
        ids = {str(i) for i in pgmb.send_batch(("k", n) for n in range(50))}
        wait_until(lambda: _ids(server_a) >= ids, message="default's messages, the second down")
        assert not any("[second] database reconnected" in line for line in stderr)

    wait_until(
        lambda: any("[second] database reconnected" in line for line in stderr),
        message="the dispatcher to reconnect to the second database",
    )
    pgmb.send("k", "after", using=SECOND)
    wait_until(lambda: len(server_b.requests) == 2, message="the second's message after the outage")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    reader.join(timeout=60)
    assert [r.json() for r in server_b.requests] == ["before", "after"]
    assert _ids(server_a) == ids
    assert not any("[default] database unavailable" in line for line in stderr)
    # It stayed registered through the outage: one row in each database, both stopped.
    for alias in ("default", SECOND):
        [row] = DispatcherProcess.objects.using(alias).filter(pid=proc.pid)
        assert row.stopped_at is not None, alias


@both_databases
def test_until_idle_gives_up_on_an_unreachable_database_after_serving_the_other(
    spawn, make_recording_server
):
    server = make_recording_server()
    _queue("default", server.url())
    ids = {str(i) for i in pgmb.send_batch(("k", n) for n in range(20))}
    with _closed_to_connections(SECOND):
        proc = spawn(*BOTH, "--until-idle", "--give-up-after", "1")
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert _ids(server) == ids
    assert not Delivery.objects.exists()
    assert "database=default claimed=20 delivered=20" in out
    last = err.strip().splitlines()[-1]
    assert last.startswith("CommandError: gave up: database 'second' is unreachable for"), err


@pytest.fixture
def unmigrated_database(transactional_db) -> Iterator[str]:
    """An empty database on the same server: pgmb was never migrated there."""
    name = f"pgmb_unmigrated_{uuid.uuid4().hex[:8]}"
    with _superuser() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield name
    with _superuser() as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_a_database_without_pgmb_is_retried_while_the_other_delivers(
    spawn, recording_server, make_worker, make_queue, unmigrated_database
):
    queue = make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    ids = {str(i) for i in pgmb.send_batch(("k", n) for n in range(20))}
    proc = spawn(
        *BOTH,
        *["--queue", queue.name, "--until-idle", "--give-up-after", "1", "--poll-interval", "0.1"],
        extra_env={"PGMB_SECOND_DB_NAME": unmigrated_database},
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert _ids(recording_server) == ids
    assert "database=default claimed=20 delivered=20" in out
    # Its queues could not be read for --queue: said, and left to its dispatcher.
    assert "could not read the queues of database 'second'" in err
    # Logged with what is wrong, started again (more than once), then given up.
    assert err.count("[second] dispatcher failed") >= 2, err
    assert "does not exist" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("CommandError: gave up: database 'second' kept failing for"), err
    assert "default" not in last


@both_databases
def test_sigterm_stops_every_database_finishing_and_releasing_each_ones_deliveries(
    spawn, make_recording_server
):
    servers = {"default": make_recording_server(), SECOND: make_recording_server()}
    for alias, server in servers.items():
        server.respond(reply(200, delay=1.0))
        _queue(alias, server.url(), rps=4)
        pgmb.send_batch((("k", n) for n in range(40)), using=alias)
    proc = spawn(*BOTH, "--concurrency", "10", "--batch", "10")
    wait_until(
        lambda: all(server.in_flight >= 1 for server in servers.values()),
        message="a request in flight to each database's worker",
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    for alias, server in servers.items():
        posted = len(server.requests)
        assert 1 <= posted < 40, alias  # it stopped rather than deliver everything
        acked = Attempt.objects.using(alias).filter(outcome="ack").count()
        assert acked == posted, alias  # the requests in flight finished
        assert not Delivery.objects.using(alias).filter(state="leased").exists(), alias
        assert Delivery.objects.using(alias).count() == 40 - posted, alias
        assert set(Delivery.objects.using(alias).values_list("attempts", flat=True)) == {0}
