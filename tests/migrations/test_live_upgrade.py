"""The upgrade from each release under running dispatchers (docs/operations.md, Upgrading).

A database migrated by the release itself (its wheel, built from the release commit:
tests/migrations/released_code.py) and filled through the SQL API with ready, delayed,
leased, retrying, dead-lettered, grouped and pull deliveries is migrated by this checkout
while the release's ``pgmb_dispatch`` and ``pgmb_consume`` and the in-database loop (CALLed as
pg_cron calls it) deliver to a real HTTP server and a publisher sends all along. Then this
checkout's ``pgmb_dispatch`` and ``pgmb_consume`` take over. Every message arrives; none is
posted twice but where its attempt log says a lease ran out or a request failed; groups
arrive in order; no process stalls or logs errors, no send fails (a deadlock with the
migration would fail one); the release's functions, types and columns are as they were; and the
schema is a fresh install's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.httpserver import RecordingServer, slow
from tests.migrations.conftest import ROOT, manage
from tests.migrations.releases import RELEASE_COMMITS, RELEASED
from tests.processes import StderrLines
from tests.waiting import wait_until

#: Every migration of this checkout, as django_migrations names them once it has migrated.
MIGRATIONS = sorted(p.stem for p in (ROOT / "pgmb" / "migrations").glob("[0-9]*.py"))

FINGERPRINT = (Path(__file__).parent / "fingerprint.sql").read_text()

#: The kinds of push deliveries: each has a queue per dispatch path (``ext_<kind>`` served
#: by pgmb_dispatch, ``indb_<kind>`` by the in-database loop), both bound to ``<kind>.#``.
PUSH_KINDS = ("ready", "delayed", "leased", "retrying", "dead", "group", "live")
EXTERNAL = [f"ext_{kind}" for kind in PUSH_KINDS]
IN_DATABASE = [f"indb_{kind}" for kind in PUSH_KINDS]
PULL = "pull_box"  # bound to pull.#, read by clients

#: What code written for a release calls and reads in the database: each function and
#: procedure of schema pgmb (its arguments with their names, as named notation calls them,
#: how many have defaults, its result), and the columns of pgmb's types, views and tables.
#: The next release's migration keeps every row (CONTRIBUTING.md, Migrations): it may add,
#: never change or take away, until the release after it.
SURFACE = """
SELECT 'routine', format('%s(%s)', p.oid::regproc, pg_get_function_identity_arguments(p.oid)),
       concat_ws(' ', p.prokind, p.pronargdefaults, pg_get_function_result(p.oid))
FROM pg_proc p WHERE p.pronamespace = 'pgmb'::regnamespace
UNION ALL
SELECT 'column', format('%s.%s', c.oid::regclass, a.attname), format_type(a.atttypid, a.atttypmod)
FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
-- A partitioned table ('p') is the table its release's statements name; its partitions are
-- not part of the surface.
WHERE c.relkind IN ('r', 'p', 'v', 'c') AND NOT c.relispartition
  AND (c.relnamespace = 'pgmb'::regnamespace
       OR c.relnamespace = 'public'::regnamespace AND c.relname LIKE 'pgmb\\_%')
  -- Per-queue views are made by the queues, not by the migrations.
  AND NOT (c.relkind = 'v' AND c.relname LIKE '%\\_queue')
"""

#: What a migration takes away from an earlier release's surface on purpose (kind, name):
#: nothing. A row here needs its reason, and the release's notes saying what replaces it.
RETIRED: set[tuple[str, str]] = set()


@dataclass
class Sent:
    """The messages sent, in order: id, routing key, group."""

    messages: list[tuple[uuid.UUID, str, str | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, message_id: uuid.UUID, routing_key: str, group: str | None = None) -> None:
        with self.lock:
            self.messages.append((message_id, routing_key, group))

    def snapshot(self) -> list[tuple[uuid.UUID, str, str | None]]:
        with self.lock:
            return list(self.messages)

    def expected_posts(self) -> set[tuple[str, str]]:
        """(queue, message id) of every push delivery the sends made."""
        return {
            (f"{path}_{key.split('.')[0]}", str(mid))
            for mid, key, _ in self.snapshot()
            if not key.startswith("pull.")
            for path in ("ext", "indb")
        }

    def pulled(self) -> set[str]:
        return {str(mid) for mid, key, _ in self.snapshot() if key.startswith("pull.")}


def _send(conn: psycopg.Connection, sent: Sent, key: str, group: str | None = None) -> uuid.UUID:
    message_id = uuid.uuid4()
    conn.execute(
        "SELECT pgmb.send(id => %s, routing_key => %s, body => %s, headers => NULL,"
        " delay => NULL, group_key => %s)",
        (message_id, key, '{"n": 1}', group),
    )
    sent.add(message_id, key, group)
    return message_id


def _fill(conn: psycopg.Connection, server: RecordingServer, sent: Sent) -> dict[str, uuid.UUID]:
    """Deliveries of every kind, written before any dispatcher runs with the SQL API of
    0.1.0, which later releases keep."""
    q = conn.execute
    [(worker,)] = q("SELECT pgmb.worker('upgrader', %s, 1000)", (server.url("/hook"),)).fetchall()
    [(quick,)] = q("SELECT pgmb.worker('quick', %s, 1000)", (server.url("/quick"),)).fetchall()
    # Leases that run out soon: the quick worker's timeout is within them.
    q("UPDATE pgmb_worker SET timeout = 0.5 WHERE id = %s", (quick,))
    for kind in PUSH_KINDS:
        retries = {"dead": 0}.get(kind, 5)
        for path in ("ext", "indb"):
            on = quick if kind == "leased" else worker
            q("SELECT pgmb.create(%s, %s, %s, %s)", (f"{path}_{kind}", f"{kind}.#", retries, on))
    q("SELECT pgmb.create(%s, 'pull.#', 5, NULL)", (PULL,))
    q("UPDATE pgmb_queue SET backoff_base = 1, backoff_max = 1")
    q("UPDATE pgmb_queue SET lease_seconds = 1 WHERE name LIKE '%%\\_leased'")

    ids = {kind: _send(conn, sent, f"{kind}.one") for kind in ("leased", "retrying", "dead")}
    for n in range(3):
        _send(conn, sent, f"ready.{n}")
    for n in range(5):
        _send(conn, sent, f"group.{n}", group="fill")
    for n in range(4):
        _send(conn, sent, f"pull.{n}")
    # Due a few seconds from now: while the migration runs, or after it.
    ids["delayed"] = uuid.uuid4()
    q("SELECT pgmb.send(%s, 'delayed.one', '{}', NULL, 3)", (ids["delayed"],))
    sent.add(ids["delayed"], "delayed.one")

    def claim(kind: str) -> tuple[list[int], list[uuid.UUID]]:
        rows = q(
            "SELECT delivery_id, lease_id FROM pgmb.claim(%s, 10)",
            ([f"ext_{kind}", f"indb_{kind}"],),
        ).fetchall()
        assert len(rows) == 2, rows
        return [r[0] for r in rows], [r[1] for r in rows]

    # Leased, its request started: the expiry of the lease is an attempt.
    assert q("SELECT pgmb.start(%s, %s)", claim("leased")).fetchone() == (2,)
    # Failed once, due again a second later; and failed with no retries: dead-lettered.
    for kind in ("retrying", "dead"):
        delivery_ids, leases = claim(kind)
        q("SELECT pgmb.fail(%s, %s, ARRAY[500, 500])", (delivery_ids, leases))
    # A pull message read and not deleted: visible again two seconds later.
    assert len(q(f"SELECT * FROM pgmb.read('{PULL}', 2, 1)").fetchall()) == 1
    assert q("SELECT count(*) FROM pgmb_dead_letter").fetchone() == (2,)
    return ids


class Publisher:
    """Sends a message through the SQL API every few milliseconds until stopped: live.<n>
    in three groups, and every fourth to the pull queue."""

    def __init__(self, info: dict, sent: Sent) -> None:
        self.conn = psycopg.connect(**info, autocommit=True)
        self.sent = sent
        self.count = 0
        self.errors: list[BaseException] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(0.02):
            n = self.count
            try:
                if n % 4 == 3:
                    _send(self.conn, self.sent, f"pull.live.{n}")
                else:
                    _send(self.conn, self.sent, f"live.{n}", group=f"g{n % 3}")
            except psycopg.Error as exc:
                self.errors.append(exc)
            self.count += 1

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=60)
        self.conn.close()


class CronJob:
    """The in-database loop as pg_cron runs it: one ``CALL pgmb.dispatch_loop`` after
    another, each in a new session, until stopped (between two CALLs, never within one).
    A CALL lasts a few seconds: the one running when the migration commits goes on with
    the procedure it started with (pg_cron 1.4 runs one a minute, lasting 55 s)."""

    def __init__(self, info: dict, queues: list[str]) -> None:
        self.info = info
        self.queues = queues
        self.runs = 0
        self.errors: list[BaseException] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                with psycopg.connect(**self.info, autocommit=True) as conn:
                    conn.execute("CALL pgmb.dispatch_loop(3, 10, %s)", (self.queues,))
            except psycopg.Error as exc:
                self.errors.append(exc)
            self.runs += 1

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the in-database loop did not return"


def _stop(proc: subprocess.Popen) -> tuple[int, str]:
    """SIGTERM (a graceful stop), then its exit status and stdout."""
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=60)
    return proc.returncode, stdout


def _problems(stderr: StderrLines) -> list[str]:
    return [line for line in stderr.lines if "ERROR" in line or "Traceback" in line]


def _arrived(server: RecordingServer) -> Counter:
    """How many times each (queue, message id) was posted."""
    return Counter((r.headers["pgmb-queue"], r.headers["pgmb-message-id"]) for r in server.requests)


def _delivered_after(server: RecordingServer, queue: str, ids: set[str]) -> Callable[[], bool]:
    def check() -> bool:
        return any(
            r.headers["pgmb-queue"] == queue and r.headers["pgmb-message-id"] in ids
            for r in server.requests
        )

    return check


def _live_ids(sent: Sent, after: int) -> set[str]:
    """The ids of the live push messages among the sends after the first ``after``."""
    return {str(mid) for mid, key, _ in sent.snapshot()[after:] if key.startswith("live.")}


#: The handler of the pull queue's consumers, old and new: it notes each message it is
#: given (id, and how many times it has been read) in the file PGMB_TEST_CONSUMED names.
HANDLER = """
import os

def handle(message):
    with open(os.environ["PGMB_TEST_CONSUMED"], "a") as noted:
        noted.write(f"{message.message_id} {message.read_ct}\\n")
"""


class Consumed:
    """What the pull queue's consumers were given: (message id, read count) in order."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.file = folder / "consumed.txt"
        (folder / "upgrade_handler.py").write_text(HANDLER)
        self.file.touch()

    def reads(self) -> list[tuple[str, int]]:
        lines = self.file.read_text().splitlines()
        return [(mid, int(n)) for mid, n in (line.split() for line in lines if line)]

    def ids(self) -> set[str]:
        return {mid for mid, _ in self.reads()}


def _consumer_args() -> list[str]:
    return ["pgmb_consume", PULL, "--handler", "upgrade_handler.handle", "-v", "0"]


def _old_release_runs(release, dbname: str, consumed: Consumed) -> list[subprocess.Popen]:
    """The release's pgmb_dispatch (the ext_ queues) and its consumer of the pull queue."""
    return [
        release.start(dbname, "pgmb_dispatch", "-v", "0", *_queue_args(EXTERNAL)),
        release.start(dbname, *_consumer_args(), path=str(consumed.folder)),
    ]


def _surface(conn: psycopg.Connection) -> dict[tuple[str, str], str]:
    return {(kind, name): what for kind, name, what in conn.execute(SURFACE)}


@pytest.mark.django_db(transaction=True)
def test_upgrading_from_a_release_under_running_dispatchers_loses_and_doubles_nothing(
    scratch, release, recording_server, manage_process, tmp_path, monkeypatch
):
    was = release.version
    server = recording_server
    # Slow enough that requests are in flight whenever the migration takes its locks.
    server.respond(slow(0.05))
    server.respond(slow(0.05), path="/quick")
    sent = Sent()
    consumed = Consumed(tmp_path)
    monkeypatch.setenv("PGMB_TEST_CONSUMED", str(consumed.file))
    with scratch("pgmb_live_upgrade") as info, psycopg.connect(**info, autocommit=True) as conn:
        dbname = info["dbname"]
        release.manage(dbname, "migrate", "--noinput", "-v", "0")
        assert conn.execute(
            "SELECT array_agg(name ORDER BY name) FROM django_migrations WHERE app = 'pgmb'"
        ).fetchone() == (RELEASED[: list(RELEASE_COMMITS).index(was) + 1],)
        # The in-database path posts through the http extension where it can be had (the
        # stand-in, tests/pg_http), else through the release's PL/Python transport.
        if conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'http'").fetchone():
            conn.execute("CREATE EXTENSION IF NOT EXISTS http CASCADE")
        transport = conn.execute("SELECT pgmb.http_transport()").fetchone()[0]
        if transport is None:
            pytest.skip("neither the http extension nor plpython3u: no in-database loop here")

        ids = _fill(conn, server, sent)

        # The release at work: its pgmb_dispatch and consumer, the in-database loop, a publisher.
        old = _old_release_runs(release, dbname, consumed)
        old_stderr = [StderrLines(proc) for proc in old]
        cron = CronJob(info, IN_DATABASE)
        publisher = Publisher(info, sent)
        try:
            for queue in ("ext_ready", "indb_ready"):
                wait_until(
                    _delivered_after(server, queue, {str(m) for m, k, _ in sent.snapshot()}),
                    message=f"{was} delivering {queue} before the upgrade",
                )
            wait_until(consumed.reads, message=f"{was}'s consumer reading before the upgrade")

            # The upgrade, with every one of them running.
            surface = _surface(conn)
            before = len(server.requests)
            manage(dbname, "migrate", "--noinput", "-v", "0")
            kept = _surface(conn)
            changed = {
                key: (was, kept.get(key))
                for key, was in surface.items()
                if kept.get(key) != was and key not in RETIRED
            }
            assert changed == {}, f"{was}'s code calls or reads what the migration changed"
            for proc, stderr in zip(old, old_stderr, strict=True):
                assert proc.poll() is None, f"{was}'s {proc.args[3]} exited: {stderr.lines}"
            assert conn.execute(
                "SELECT count(*) FROM django_migrations WHERE app = 'pgmb'"
            ).fetchone() == (len(MIGRATIONS),)

            # The release goes on delivering and consuming what is sent after the migration.
            mark = len(sent.snapshot())
            for queue in ("ext_live", "indb_live"):
                wait_until(
                    lambda q=queue: _delivered_after(server, q, _live_ids(sent, mark))(),
                    message=f"{queue}: {was}'s dispatch stuck after the migration",
                )
            wait_until(
                lambda: consumed.ids() & _pulled_ids(sent, mark),
                message=f"{was}'s consumer stuck after the migration",
            )
            assert len(server.requests) > before

            # This checkout's pgmb_dispatch and consumer take over from the release's.
            for proc, stderr in zip(old, old_stderr, strict=True):
                status, _ = _stop(proc)
                assert status == 0, f"{was}'s {proc.args[3]} exited {status}: {stderr.lines}"
            here = {"PGMB_DB_NAME": dbname, "PGMB_TEST_CONSUMED": str(consumed.file)}
            new = [
                manage_process("pgmb_dispatch", "-v", "0", *_queue_args(EXTERNAL), env=here),
                manage_process(
                    *_consumer_args(),
                    env={**here, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])},
                ),
            ]
            new_stderr = [StderrLines(proc) for proc in new]
            for queue in ("ext_dead", "indb_dead"):
                assert conn.execute("SELECT pgmb.requeue(%s)", (queue,)).fetchone() == (1,)
            mark = len(sent.snapshot())
            wait_until(
                lambda: _delivered_after(server, "ext_live", _live_ids(sent, mark))(),
                message="this checkout's pgmb_dispatch delivering",
            )
            wait_until(
                lambda: consumed.ids() & _pulled_ids(sent, mark),
                message="this checkout's consumer reading",
            )
        finally:
            publisher.stop()
            for proc in old:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)

        # Everything sent arrives: pushed to both paths, or handed to a consumer.
        expected = sent.expected_posts()

        def missing() -> set[tuple[str, str]]:
            return expected - set(_arrived(server))

        wait_until(
            lambda: not missing() and consumed.ids() >= sent.pulled(),
            timeout=90,
            message=lambda: (
                f"deliveries never posted: {sorted(missing())[:10]}; never consumed: "
                f"{sorted(sent.pulled() - consumed.ids())[:10]}"
            ),
        )
        cron.stop()
        for proc, stderr in zip(new, new_stderr, strict=True):
            status, _ = _stop(proc)
            assert status == 0, f"this checkout's {proc.args[3]} exited {status}: {stderr.lines}"

        # A deadlock with the migration would show here (docs/decisions/0062).
        assert [str(e) for e in publisher.errors] == [], "a send failed while the upgrade ran"
        assert [str(e) for e in cron.errors] == [], "a CALL of the in-database loop failed"
        for stderr in old_stderr:
            assert _problems(stderr) == [], f"a process of {was} logged errors"
        for stderr in new_stderr:
            assert _problems(stderr) == [], "a process of this checkout logged errors"
        assert consumed.ids() == sent.pulled()
        assert conn.execute("SELECT count(*) FROM pgmb_delivery").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pgmb_dead_letter").fetchone() == (0,)

        # Posted once, or once more for each attempt that ended without an ack (a lease
        # that ran out, a request that failed): never a second ack.
        attempts: dict[tuple[str, str], list[str]] = defaultdict(list)
        for queue, message_id, outcome in conn.execute(
            "SELECT q.name, a.message_id::text, a.outcome FROM pgmb_attempt a"
            " JOIN pgmb_queue q ON q.id = a.queue_id ORDER BY a.id"
        ):
            attempts[(queue, message_id)].append(outcome)
        posts = _arrived(server)
        unexplained = {
            key: (n, attempts.get(key))
            for key, n in posts.items()
            if n > len(attempts.get(key, [])) or attempts.get(key, []).count("ack") != 1
        }
        assert unexplained == {}, "posted more often than the attempt log explains"
        assert {key for key in attempts if key[0] != PULL} == expected
        for path in ("ext", "indb"):
            outcomes = {kind: attempts[(f"{path}_{kind}", str(ids[kind]))] for kind in ids}
            assert outcomes["leased"][0] == "expired"  # its lease from before the upgrade
            assert outcomes["retrying"][0] == "retry"
            assert outcomes["dead"][0] == "dead"
            assert all(o[-1] == "ack" for o in outcomes.values()), outcomes
        # A pull message is deleted once; handed over again only when its visibility
        # ran out first, which a later read (a higher read count) shows.
        reads: dict[str, list[int]] = defaultdict(list)
        for message_id, read_ct in consumed.reads():
            reads[message_id].append(read_ct)
        assert {m: n for m, n in reads.items() if len(set(n)) != len(n)} == {}
        assert {m for m in sent.pulled() if attempts[(PULL, m)] != ["ack"]} == set()

        _assert_groups_in_order(server, sent)

        # The same schema as a fresh install (the test database).
        conn.execute("DROP EXTENSION IF EXISTS http")
        with connection.cursor() as cursor:
            cursor.execute(FINGERPRINT)
            fresh = cursor.fetchall()
        assert conn.execute(FINGERPRINT).fetchall() == fresh
        print(f"transport {transport}; {cron.runs} loop runs; {len(posts)} deliveries posted")


def _assert_groups_in_order(server: RecordingServer, sent: Sent) -> None:
    """Each group's messages were first posted in the order they were sent, on both paths."""
    first_posts: dict[tuple[str, str], list[str]] = defaultdict(list)
    seen = set()
    groups = {str(mid): group for mid, _, group in sent.snapshot() if group}
    for r in server.requests:
        key = (r.headers["pgmb-queue"], r.headers["pgmb-message-id"])
        if key[1] in groups and key not in seen:
            seen.add(key)
            first_posts[(key[0], groups[key[1]])].append(key[1])
    for (queue, group), arrived in first_posts.items():
        kind = queue.split("_", 1)[1]
        order = [
            str(mid) for mid, key, g in sent.snapshot() if g == group and key.split(".")[0] == kind
        ]
        assert arrived == order, f"group {group} of {queue} out of order"
    assert len(first_posts) == 2 * 4  # the fill's group and the publisher's three, both paths


def _pulled_ids(sent: Sent, after: int) -> set[str]:
    """The ids of the pull messages among the sends after the first ``after``."""
    return {str(mid) for mid, key, _ in sent.snapshot()[after:] if key.startswith("pull.")}


def _queue_args(queues: list[str]) -> list[str]:
    return [arg for queue in queues for arg in ("--queue", queue)]
