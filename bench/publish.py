"""Publishing throughput: pgmb's publish path against plain INSERTs into a twin table.

Run it with ``make bench`` (a throwaway PostgreSQL cluster), or directly given the libpq
variables of a server where the user may create databases::

    .venv/bin/python bench/publish.py [--seconds 1.5] [--rounds 4] [--investigate]

It creates a scratch database (``pgmb_bench``, dropped at the end), migrates it, registers
one worker with a queue bound to ``order.*`` and a few queues that must not match, and a
baseline table of the same shape as ``pgmb_message`` with no trigger, no CHECK and no
deliveries. Each case then publishes for a fixed time from 1 or 4 client processes
(processes, so that the GIL is not what is measured), each with its own Django connection
in autocommit, calling the real ``pgmb.send`` / ``pgmb.send_batch``. The baseline runs
the very statements of ``pgmb/sql/publish.sql`` with only the table name changed, through
the same Django connection, so a ratio isolates what routing costs in the database.

Every case runs next to a run of its baseline, ``--rounds`` times, and the best run of
each counts: other work on a shared machine can only slow a run down. Runs during which
other processes kept the machine busy are repeated (see QUIET), and the load they saw is
printed. At the end it checks the routing: every message has exactly one delivery, in the
``order.*`` queue, and the counts match what the clients reported.

``--investigate`` (about 2 more minutes) then shows where the time goes: EXPLAIN ANALYZE of
a batch, and variants of the schema (without the CHECKs, the unique index, the FK, the
trigger, with NOTIFY throttled, ...), each in a fresh copy of the database, measured in the
server itself (DO blocks, no client) so that the differences are not lost in client noise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import re
import statistics
import sys
import time
import traceback
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ROUTING_KEYS = ("order.created", "order.paid", "order.shipped")
MATCHING_BINDING = "order.*"
#: Queues that must get nothing: they make the trigger's regex join do real work.
OTHER_BINDINGS = {
    "invoice_events": "invoice.#",
    "user_deleted": "user.*.deleted",
    "order_eu": "order.*.eu",
    "audit_payments": "payment.#",
}
BATCH = 100
BASELINE_TABLE = "bench_baseline"
BASELINE_DDL = f"""
CREATE TABLE {BASELINE_TABLE} (
    id uuid PRIMARY KEY,
    routing_key text NOT NULL,
    body jsonb NOT NULL,
    headers jsonb NOT NULL DEFAULT '{{}}',
    created_at timestamptz NOT NULL DEFAULT now(),
    available_at timestamptz NOT NULL DEFAULT now()
)
"""


def _body(n: int) -> dict:
    """A plausible order event (~120 bytes of JSON)."""
    return {
        "order_id": n,
        "customer": f"c-{n % 9973:05d}",
        "total": "129.90",
        "currency": "EUR",
        "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}],
    }


# --- What one client does, once per call; each returns how many messages it published. ---


def _op_send(n: int) -> int:
    import pgmb

    pgmb.send(ROUTING_KEYS[n % 3], _body(n))
    return 1


def _op_send_batch(n: int) -> int:
    import pgmb

    pgmb.send_batch([(ROUTING_KEYS[i % 3], _body(n + i)) for i in range(BATCH)])
    return BATCH


def _op_sql_send(n: int) -> int:
    """The seed's SQL surface, as a producer that is not Django would call it."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pgmb.send(%s, %s, %s::jsonb)",
            (uuid.uuid4(), ROUTING_KEYS[n % 3], json.dumps(_body(n))),
        )
    return 1


def _baseline_sql(name: str) -> str:
    from pgmb import sql

    return sql.query("publish.sql", name).replace("pgmb_message", BASELINE_TABLE)


def _op_insert(n: int) -> int:
    from django.db import connection

    # The parameters pgmb.send passes: id, key, body, headers, no absolute time, no delay.
    params = (uuid.uuid4(), ROUTING_KEYS[n % 3], json.dumps(_body(n)), "{}", None, None)
    with connection.cursor() as cursor:
        cursor.execute(_baseline_sql("send"), params)
    return 1


def _op_insert_batch(n: int) -> int:
    from django.db import connection

    columns = (
        [uuid.uuid4() for _ in range(BATCH)],
        [ROUTING_KEYS[i % 3] for i in range(BATCH)],
        [json.dumps(_body(n + i)) for i in range(BATCH)],
        ["{}"] * BATCH,
        [None] * BATCH,
        [None] * BATCH,
    )
    with connection.cursor() as cursor:
        cursor.execute(_baseline_sql("send_batch"), columns)
    return BATCH


OPS: dict[str, Callable[[int], int]] = {
    "send": _op_send,
    "send_batch": _op_send_batch,
    "sql_send": _op_sql_send,
    "insert": _op_insert,
    "insert_batch": _op_insert_batch,
}
#: Which table each operation writes, for the final count check.
TABLE_OF = {
    "send": "pgmb",
    "send_batch": "pgmb",
    "sql_send": "pgmb",
    "insert": "baseline",
    "insert_batch": "baseline",
}


# --- Client processes. ---


def _processes() -> dict[int, tuple[int, float]]:
    """Every process on this machine: pid -> (parent pid, CPU seconds so far)."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited meanwhile
            found[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return found


class OtherLoad:
    """CPU that processes other than ours use: other people's work on a shared machine.

    Ours are this process and its children (the clients) and the children of our server's
    postmaster (backends, autovacuum, WAL writer, checkpointer). Kernel threads are left
    out too: they do the I/O of whoever asks, us included.
    """

    def __init__(self, backend_pid: int | None) -> None:
        procs = _processes()
        self.ours = {os.getpid()}
        if backend_pid in procs:
            self.ours.add(procs[backend_pid][0])  # the postmaster
        self._start = procs
        self._began = time.monotonic()

    def _foreign(self, pid: int, parent: int) -> bool:
        return pid not in self.ours and parent not in self.ours and 2 not in (pid, parent)

    def start(self) -> None:
        self._start, self._began = _processes(), time.monotonic()

    def cores(self) -> float:
        """Cores used by the others since :meth:`start`."""
        now, used = _processes(), 0.0
        for pid, (parent, cpu) in now.items():
            if self._foreign(pid, parent):
                used += cpu - self._start.get(pid, (parent, 0.0))[1]
        return max(0.0, used) / max(time.monotonic() - self._began, 1e-6)


#: Runs during which other people's processes kept more than this many cores busy are
#: repeated.
QUIET = 0.25
#: ... at most this many times each, and at most REPEAT_BUDGET times in the main table (so
#: that a busy machine costs it half a minute more, not double).
RETRIES = 1
REPEAT_BUDGET = 16


def _backend_cpu(pid: int | None) -> float:
    """CPU seconds used so far by a server backend, when the server runs on this machine."""
    if pid is None:
        return 0.0
    # schedstat counts nanoseconds; stat counts clock ticks (10 ms), too coarse for short runs.
    with (
        contextlib.suppress(OSError, ValueError, IndexError),
        open(f"/proc/{pid}/schedstat", encoding="ascii") as schedstat,
    ):
        return int(schedstat.read().split()[0]) / 1e9
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime and stime, fields 14 and 15 of proc(5), counted from after "(comm)".
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _client(pipe: Connection, local_server: bool) -> None:
    """A producer process: runs one operation in a loop when told, reports what it did."""
    from django.db import connection

    backend: int | None = None
    while True:
        command = pipe.recv()
        try:
            if command[0] == "stop":
                connection.close()
                return
            if command[0] == "close":
                connection.close()
                backend = None
                pipe.send(("ok", None))
                continue
            _, op_name, notify, database, start_at, seconds = command
            if connection.settings_dict["NAME"] != database:
                connection.close()
                connection.settings_dict["NAME"] = database
                backend = None
            with connection.cursor() as cursor:
                cursor.execute(f"SET pgmb.notify = {'on' if notify else 'off'}")
                if backend is None and local_server:
                    cursor.execute("SELECT pg_backend_pid()")
                    (backend,) = cursor.fetchone()
            op = OPS[op_name]
            # Start together and stop on the wall clock: the rate is what the server
            # sustains with this many producers busy, not how fast one of them starts.
            time.sleep(max(0.0, start_at - time.time()))
            server_cpu, client_cpu = _backend_cpu(backend), time.process_time()
            end = start_at + seconds
            count = 0
            seq = os.getpid() * 10_000_000
            while time.time() < end:
                count += op(seq + count)
            finish = time.time()
            server_cpu = _backend_cpu(backend) - server_cpu
            client_cpu = time.process_time() - client_cpu
            pipe.send(("ok", (count, finish, server_cpu, client_cpu)))
        except Exception:
            pipe.send(("error", traceback.format_exc()))


@dataclass(frozen=True)
class Measure:
    """What one timed run did: messages, their rate, CPU per message on each side, WAL."""

    messages: int
    rate: float
    server_us: float
    client_us: float
    wal_bytes: float
    #: Cores kept busy by other processes during the run (other work on a shared machine).
    foreign: float


class Clients:
    """A fixed set of producer processes, forked once, each with its own connection."""

    def __init__(self, n: int, local_server: bool) -> None:
        from django.db import connections

        self.local_server = local_server
        # A forked child must not share a socket with the parent.
        connections.close_all()
        ctx = mp.get_context("fork")
        self.pipes: list[Connection] = []
        self.procs = []
        for _ in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_client, args=(child, local_server), daemon=True)
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)
        # WAL is counted cluster-wide: exact on the throwaway cluster of `make bench`.
        self.admin = admin_connection()
        self.others = OtherLoad(self.admin.info.backend_pid) if local_server else None

    def _answer(self, pipe: Connection):
        status, value = pipe.recv()
        if status != "ok":
            raise RuntimeError(f"a client failed:\n{value}")
        return value

    def _wal(self) -> int:
        return self.admin.execute("SELECT pg_current_wal_insert_lsn() - '0/0'").fetchone()[0]

    def run(self, run: Run, database: str, seconds: float) -> Measure:
        """Run ``run.op`` from ``run.clients`` processes for ``seconds``."""
        start_at = time.time() + 0.2
        pipes = self.pipes[: run.clients]
        for pipe in pipes:
            pipe.send(("run", run.op, run.notify, database, start_at, seconds))
        wal = self._wal()
        if self.others:
            self.others.start()
        answers = [self._answer(pipe) for pipe in pipes]
        foreign = self.others.cores() if self.others else 0.0
        wal = self._wal() - wal
        total = sum(a[0] for a in answers)
        elapsed = max(a[1] for a in answers) - start_at
        per_message = 1e6 / max(total, 1)
        return Measure(
            messages=total,
            rate=total / elapsed,
            server_us=sum(a[2] for a in answers) * per_message,
            client_us=sum(a[3] for a in answers) * per_message,
            wal_bytes=float(wal) / max(total, 1),
            foreign=foreign,
        )

    def close_connections(self) -> None:
        for pipe in self.pipes:
            pipe.send(("close",))
        for pipe in self.pipes:
            self._answer(pipe)

    def stop(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(BrokenPipeError, OSError):
                pipe.send(("stop",))
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
        self.admin.close()


# --- Cases and suites. ---


@dataclass(frozen=True)
class Run:
    """One kind of timed measurement: an operation, a number of clients, NOTIFY on or off."""

    op: str
    clients: int
    notify: bool = True


@dataclass(frozen=True)
class Case:
    label: str
    run: Run
    baseline: Run


INSERT_1 = Run("insert", 1)
INSERT_4 = Run("insert", 4)
INSERT_BATCH = Run("insert_batch", 1)

MAIN_CASES = (
    Case("pgmb.send", Run("send", 1), INSERT_1),
    Case("pgmb.send, NOTIFY off", Run("send", 1, notify=False), INSERT_1),
    Case("SQL pgmb.send()", Run("sql_send", 1), INSERT_1),
    Case("pgmb.send", Run("send", 4), INSERT_4),
    Case("pgmb.send, NOTIFY off", Run("send", 4, notify=False), INSERT_4),
    Case(f"pgmb.send_batch({BATCH})", Run("send_batch", 1), INSERT_BATCH),
    Case(f"pgmb.send_batch({BATCH}), NOTIFY off", Run("send_batch", 1, False), INSERT_BATCH),
)
BASELINE_LABELS = {
    "insert": "INSERT 1 row",
    "insert_batch": f"INSERT {BATCH} rows (unnest)",
}


@dataclass
class Results:
    """Every measure of every run, summarised by the best one.

    Other work on the machine can only slow a run down, never speed it up, so the fastest
    of several runs (and the least CPU per message) is the estimate least disturbed by it;
    medians moved by 30 % between identical runs on a busy 2-core machine.
    """

    measures: dict[Run, list[Measure]] = field(default_factory=lambda: defaultdict(list))
    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    repeated: int = 0

    def foreign(self) -> list[float]:
        return [m.foreign for runs in self.measures.values() for m in runs]

    def rates(self, run: Run) -> list[float]:
        return [m.rate for m in self.measures[run]]

    def rate(self, run: Run) -> float:
        return max(self.rates(run))

    def server_us(self, run: Run) -> float:
        return min(m.server_us for m in self.measures[run])

    def client_us(self, run: Run) -> float:
        return min(m.client_us for m in self.measures[run])

    def wal_bytes(self, run: Run) -> float:
        return statistics.median(m.wal_bytes for m in self.measures[run])

    def ratio(self, case: Case) -> float:
        return self.rate(case.run) / self.rate(case.baseline)


def run_suite(
    clients: Clients, database: str, cases: Sequence[Case], rounds: int, seconds: float
) -> Results:
    """Time every case right next to a run of its baseline, ``rounds`` times.

    Running each case next to its baseline, and swapping which of the two goes first every
    other round, keeps bursts of load from elsewhere and the slow growth of the tables from
    leaning on one side of a ratio.
    """
    results = Results()
    for round_ in range(rounds):
        for case in cases:
            pair = (case.baseline, case.run) if round_ % 2 == 0 else (case.run, case.baseline)
            for run in pair:
                for attempt in range(1 + RETRIES):
                    measure = clients.run(run, database, seconds)
                    results.measures[run].append(measure)
                    results.sent[TABLE_OF[run.op]] += measure.messages
                    if (
                        measure.foreign <= QUIET
                        or attempt == RETRIES
                        or results.repeated >= REPEAT_BUDGET
                    ):
                        break
                    results.repeated += 1
    return results


def _spread(values: list[float]) -> str:
    if len(values) < 2:
        return ""
    return f"{min(values):,.0f}-{max(values):,.0f}"


def print_table(results: Results, cases: Sequence[Case], goal: float) -> None:
    head = (
        f"{'case':<36} {'clients':>7} {'msgs/s':>8} {'(range)':>15} {'baseline':>8} "
        f"{'ratio':>5}  {'server us/msg':>13} {'client us/msg':>13} {'WAL B/msg':>9}"
    )
    print(head)
    print("-" * len(head))
    shown: set[Run] = set()
    for case in cases:
        base = case.baseline
        if base not in shown:
            shown.add(base)
            label = f"baseline: {BASELINE_LABELS[base.op]}"
            print(
                f"{label:<36} {base.clients:>7} {results.rate(base):>8,.0f} "
                f"{_spread(results.rates(base)):>15} {'':>8} {'':>5}  "
                f"{results.server_us(base):>13.0f} {results.client_us(base):>13.0f} "
                f"{results.wal_bytes(base):>9.0f}"
            )
        ratio = results.ratio(case)
        mark = "" if ratio >= goal else "  < goal"
        print(
            f"{case.label:<36} {case.run.clients:>7} {results.rate(case.run):>8,.0f} "
            f"{_spread(results.rates(case.run)):>15} {results.rate(base):>8,.0f} "
            f"{ratio:>5.2f}  {results.server_us(case.run):>13.0f} "
            f"{results.client_us(case.run):>13.0f} {results.wal_bytes(case.run):>9.0f}{mark}"
        )


# --- Setup, machine, checks. ---


def admin_connection():
    """Autocommit connection to the database named by PGDATABASE, to create and drop ours."""
    import psycopg

    return psycopg.connect(dbname=os.environ.get("PGDATABASE", "postgres"), autocommit=True)


def create_database(name: str, template: str | None = None) -> None:
    from psycopg import sql as q

    with admin_connection() as admin:
        admin.execute(q.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(q.Identifier(name)))
        create = q.SQL("CREATE DATABASE {}").format(q.Identifier(name))
        if template:
            create += q.SQL(" TEMPLATE {}").format(q.Identifier(template))
        admin.execute(create)


def drop_database(name: str) -> None:
    from psycopg import sql as q

    with admin_connection() as admin:
        admin.execute(q.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(q.Identifier(name)))


def set_up(extra_queues: int = 0) -> str:
    """Migrate, register the worker and queues, create the baseline; the order queue's id.

    ``extra_queues`` more queues that match nothing (``svcN.*.#``) show how routing scales
    with the number of queues.
    """
    from django.core.management import call_command
    from django.db import connection

    from pgmb.models import Queue, Worker

    call_command("migrate", verbosity=0, interactive=False)
    worker = Worker.objects.create(name="bench", endpoint="http://127.0.0.1:9/", rps=1000)
    order = Queue.objects.create(name="order_queue", binding_key=MATCHING_BINDING, worker=worker)
    for name, binding in OTHER_BINDINGS.items():
        Queue.objects.create(name=name, binding_key=binding, worker=worker)
    for n in range(extra_queues):
        Queue.objects.create(name=f"extra_{n}", binding_key=f"svc{n}.*.#", worker=worker)
    with connection.cursor() as cursor:
        cursor.execute(BASELINE_DDL)
    connection.close()
    return str(order.id)


def machine() -> dict[str, str]:
    from django.db import connection

    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next(
                line.split(":", 1)[1].strip() for line in info if line.startswith("model name")
            )
    except (OSError, StopIteration):
        cpu = platform.processor() or cpu
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT version(), current_setting('fsync'), current_setting('synchronous_commit'),"
            " current_setting('shared_buffers'), current_setting('wal_level')"
        )
        version, fsync, sync_commit, buffers, wal_level = cursor.fetchone()
    connection.close()
    import django
    import psycopg

    return {
        "cpu": f"{cpu}, {os.cpu_count()} cores",
        "os": platform.platform(),
        "load": "{:.2f} {:.2f} {:.2f} (1, 5, 15 min)".format(*os.getloadavg()),
        "postgres": version.split(" on ")[0],
        "server": (
            f"fsync={fsync} synchronous_commit={sync_commit} shared_buffers={buffers} "
            f"wal_level={wal_level}"
        ),
        "client": (
            f"Python {platform.python_version()}, Django {django.__version__}, "
            f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__})"
        ),
    }


def verify(order_queue: str, sent: dict[str, int]) -> list[str]:
    """What is wrong with the routing of everything published (empty when all is well)."""
    from django.db import connection

    problems = []
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pgmb_message")
        (messages,) = cursor.fetchone()
        cursor.execute(f"SELECT count(*) FROM {BASELINE_TABLE}")
        (baseline,) = cursor.fetchone()
        cursor.execute(
            """
            SELECT count(*) FILTER (WHERE n <> 1)
            FROM (SELECT m.id, count(d.id) AS n
                  FROM pgmb_message m
                  LEFT JOIN pgmb_delivery d ON d.message_id = m.id AND d.queue_id = %s
                  GROUP BY m.id) AS per_message
            """,
            [order_queue],
        )
        (not_once,) = cursor.fetchone()
        cursor.execute(
            "SELECT q.name, count(*) FROM pgmb_delivery d JOIN pgmb_queue q ON q.id = d.queue_id"
            " WHERE d.queue_id <> %s GROUP BY q.name",
            [order_queue],
        )
        strays = cursor.fetchall()
    connection.close()
    if messages != sent["pgmb"]:
        problems.append(f"{messages:,} messages stored, clients reported {sent['pgmb']:,}")
    if baseline != sent["baseline"]:
        problems.append(f"{baseline:,} baseline rows stored, clients reported {sent['baseline']:,}")
    if not_once:
        problems.append(f"{not_once:,} messages without exactly one delivery in {MATCHING_BINDING}")
    for name, count in strays:
        problems.append(f"{count:,} deliveries in queue {name}, which must match nothing")
    if not messages:
        problems.append("nothing was published")
    return problems


# --- Investigation: which part of the routing costs what. ---


def _route_function(cursor) -> tuple[str, str]:
    """The signature and body of the function behind pgmb_message's routing trigger."""
    cursor.execute(
        "SELECT p.oid::regprocedure::text, p.prosrc FROM pg_trigger t"
        " JOIN pg_proc p ON p.oid = t.tgfoid"
        " WHERE t.tgrelid = 'pgmb_message'::regclass AND NOT t.tgisinternal"
    )
    return cursor.fetchone()


def _replace_route_function(cursor, body: str) -> None:
    signature, _ = _route_function(cursor)
    cursor.execute(
        f"CREATE OR REPLACE FUNCTION {signature} RETURNS trigger LANGUAGE plpgsql"
        f" AS $route$ {body} $route$"
    )


def _drop_fk(cursor) -> None:
    cursor.execute(
        "SELECT conname FROM pg_constraint"
        " WHERE conrelid = 'pgmb_delivery'::regclass AND contype = 'f'"
    )
    for (name,) in cursor.fetchall():
        cursor.execute(f'ALTER TABLE pgmb_delivery DROP CONSTRAINT "{name}"')


def _drop_trigger(cursor) -> None:
    cursor.execute(
        "SELECT tgname FROM pg_trigger"
        " WHERE tgrelid = 'pgmb_message'::regclass AND NOT tgisinternal"
    )
    for (name,) in cursor.fetchall():
        cursor.execute(f'DROP TRIGGER "{name}" ON pgmb_message')


#: pgtrigger wraps every trigger body in a check of the GUC pgtrigger.ignore that reads
#: it inside BEGIN ... EXCEPTION: a subtransaction, and an error raised and caught on
#: every statement when the GUC is unset (the usual case).
_IGNORE_CHECK = re.compile(
    r"IF \((?:\"?\w+\"?\.)?_pgtrigger_should_ignore\(TG_NAME\) IS TRUE\) THEN.*?END IF;\s*END IF;",
    re.DOTALL,
)


def _without_ignore_check(cursor) -> None:
    _, body = _route_function(cursor)
    stripped, found = _IGNORE_CHECK.subn("", body)
    if not found:
        raise RuntimeError("pgtrigger's ignore check not found in the routing function")
    _replace_route_function(cursor, stripped)


def _preset_ignore(cursor) -> None:
    # With the GUC set, current_setting() succeeds and no error is raised and caught.
    cursor.execute("SELECT current_database()")
    (database,) = cursor.fetchone()
    cursor.execute(f"ALTER DATABASE \"{database}\" SET pgtrigger.ignore = '{{}}'")


#: The shipped NOTIFY, but at most once per 100 ms per session: the committers that skip
#: it skip the cluster-wide lock that NOTIFY takes at commit.
_THROTTLED_NOTIFY = """
IF FOUND AND coalesce(current_setting('pgmb.notify', true), '') <> 'off'
   AND extract(epoch FROM clock_timestamp())
       - coalesce(nullif(current_setting('pgmb.notified_at', true), '')::float8, 0) > 0.1 THEN
    PERFORM pg_notify('pgmb', '');
    PERFORM set_config('pgmb.notified_at', extract(epoch FROM clock_timestamp())::text, false);
END IF;
"""
_NOTIFY = re.compile(r"IF FOUND AND .*?pg_notify\('pgmb', ''\);\s*END IF;", re.DOTALL)


def _throttle_notify(cursor) -> None:
    _, body = _route_function(cursor)
    throttled, found = _NOTIFY.subn(_THROTTLED_NOTIFY, body)
    if not found:
        raise RuntimeError("the routing function's NOTIFY not found")
    _replace_route_function(cursor, throttled)


def explain_batch(database: str, rows: int = 1000) -> None:
    """EXPLAIN ANALYZE one batch into each table, with the trigger's own INSERT, rolled back.

    The routing trigger's INSERT is a nested statement, invisible to EXPLAIN; auto_explain
    with ``log_nested_statements`` shows it. The FK's per-row checks appear as the time of
    its constraint trigger.
    """
    import psycopg

    notices: list[str] = []
    columns = (
        [uuid.uuid4() for _ in range(rows)],
        [ROUTING_KEYS[i % 3] for i in range(rows)],
        [json.dumps(_body(i)) for i in range(rows)],
        ["{}"] * rows,
        [None] * rows,
        [None] * rows,
    )
    from pgmb import sql

    statements = {
        f"baseline: {rows} rows": _baseline_sql("send_batch"),
        f"pgmb_message: {rows} rows": sql.query("publish.sql", "send_batch"),
    }
    with psycopg.connect(dbname=database) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        for title, statement in statements.items():
            # Once first, so that neither side pays for planning or a cold cache.
            with conn.transaction(force_rollback=True):
                conn.execute(statement, columns)
            notices.clear()
            with conn.transaction(force_rollback=True):
                # The FK on pgmb_delivery is deferred: checked at commit, which a rolled-back
                # EXPLAIN never reaches. Immediate, its checks show up in the plan.
                conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
                conn.execute("LOAD 'auto_explain'")
                for setting in (
                    # 1 ms: the batches, not the 1000 FK checks (logging each would
                    # cost more than the checks themselves).
                    "log_min_duration = 1",
                    "log_analyze = on",
                    "log_buffers = on",
                    "log_wal = on",
                    "log_nested_statements = on",
                    "log_triggers = on",
                    "log_level = notice",
                ):
                    conn.execute(f"SET LOCAL auto_explain.{setting}")
                conn.execute(statement, columns)
            print(f"\n== EXPLAIN ANALYZE, {title} ==")
            for notice in notices:
                print(notice.strip())


def _empty_trigger(cursor) -> None:
    _replace_route_function(cursor, "BEGIN RETURN NULL; END;")


_DELIVERY_INSERT = re.compile(r"INSERT INTO pgmb_delivery.*?;", re.DOTALL)
#: The routing INSERT with a cheap test first: a binding whose first word is literal can only
#: match keys with the same first word, so most pairs never reach the regex.
_PREFILTERED = """INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at,
                           created_at)
SELECT m.id, q.id, 'ready', 0, m.available_at, m.created_at
FROM new_messages AS m
JOIN pgmb_queue AS q
  ON CASE WHEN split_part(q.binding_key, '.', 1) IN ('*', '#')
            OR split_part(q.binding_key, '.', 1) = split_part(m.routing_key, '.', 1)
          THEN ('.' || m.routing_key) ~ q.pattern
          ELSE false END;"""


def _prefilter_routing(cursor) -> None:
    _, body = _route_function(cursor)
    prefiltered, found = _DELIVERY_INSERT.subn(lambda _: _PREFILTERED, body)
    if not found:
        raise RuntimeError("the routing function's INSERT INTO pgmb_delivery not found")
    _replace_route_function(cursor, prefiltered)


def _add_queues(n: int) -> Callable[[Any], None]:
    """``n`` more queues matching nothing, each with its own first word (svcN.*.#)."""
    return _ddl(
        "SELECT pgmb.create('extra_' || i, 'svc' || i || '.*.#', 5, w.id)"
        f" FROM generate_series(1, {n}) AS i, (SELECT id FROM pgmb_worker LIMIT 1) AS w"
    )


def _routing_in_publish(cursor) -> str:
    """The message INSERT with the trigger's delivery INSERT after it, in one statement."""
    _, body = _route_function(cursor)
    match = _DELIVERY_INSERT.search(body)
    if not match:
        raise RuntimeError("the routing function's INSERT INTO pgmb_delivery not found")
    deliveries = match.group(0).rstrip(";").replace("new_messages", "m")
    deliveries = deliveries.replace("{", "{{").replace("}", "}}")
    return f"WITH m AS ({_MESSAGES} RETURNING *) {deliveries}"


@dataclass(frozen=True)
class Variant:
    """Changes to a fresh copy of the migrated database, and whether NOTIFY is on.

    ``publish``, given a cursor before the changes, returns another statement to publish
    with (a template like ``_MESSAGES``).
    """

    name: str
    changes: tuple[Callable[[Any], None], ...] = ()
    notify: bool = False
    publish: Callable[[Any], str] | None = None


def _ddl(statement: str) -> Callable[[Any], None]:
    return lambda cursor: cursor.execute(statement)


def _drop_checks(cursor) -> None:
    cursor.execute(
        "SELECT conrelid::regclass::text, conname FROM pg_constraint WHERE contype = 'c'"
        " AND conrelid IN ('pgmb_message'::regclass, 'pgmb_delivery'::regclass)"
    )
    for table, name in cursor.fetchall():
        cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')


_DROP_UNIQUE = _ddl("ALTER TABLE pgmb_delivery DROP CONSTRAINT pgmb_delivery_message_queue")
_DROP_DUE = _ddl("DROP INDEX pgmb_delivery_due")

VARIANTS = (
    Variant("as shipped, NOTIFY on", notify=True),
    Variant("NOTIFY throttled (100 ms/session)", (_throttle_notify,), notify=True),
    Variant("as shipped"),
    Variant("without the CHECKs (message, delivery)", (_drop_checks,)),
    Variant("without unique (message_id, queue_id)", (_DROP_UNIQUE,)),
    Variant("without the index pgmb_delivery_due", (_DROP_DUE,)),
    Variant("without the FK delivery.queue_id", (_drop_fk,)),
    Variant("without pgtrigger's ignore check", (_without_ignore_check,)),
    Variant("pgtrigger.ignore preset to '{}'", (_preset_ignore,)),
    Variant(
        "without FK, ignore check, CHECKs, unique",
        (_drop_fk, _without_ignore_check, _drop_checks, _DROP_UNIQUE),
    ),
    Variant("routing trigger that does nothing", (_empty_trigger,)),
    Variant("without the routing trigger", (_drop_trigger,)),
    Variant(
        "no trigger: routing INSERT in the publish CTE",
        (_drop_trigger,),
        publish=_routing_in_publish,
    ),
    Variant(
        "proposed: no FK, no ignore check, throttled",
        (_drop_fk, _without_ignore_check, _throttle_notify),
        notify=True,
    ),
)
#: PostgreSQL keeps the last 32 compiled regexes per backend; past that, every match
#: compiles its pattern again.
QUEUE_VARIANTS = (
    Variant("50 queues (45 more)", (_add_queues(45),)),
    Variant("50 queues, first-word prefilter", (_add_queues(45), _prefilter_routing)),
    Variant("5 queues, first-word prefilter", (_prefilter_routing,)),
)


#: Messages published by a DO block, so that no client, driver or round trip is measured:
#: what the server spends on a message. {commit} is "COMMIT;" to make every statement its
#: own transaction (as autocommit producers do) or "" to keep them all in one.
_IN_SERVER = """
DO $$ BEGIN
    FOR j IN 1..{statements} LOOP
        {insert};
        {commit}
    END LOOP;
END $$"""
_MESSAGES = """INSERT INTO {table} (id, routing_key, body, headers, created_at, available_at)
        SELECT gen_random_uuid(), (ARRAY{keys})[1 + i % 3], {body}::jsonb, '{{}}', now(), now()
        FROM generate_series(1, {rows}) AS i"""


@dataclass(frozen=True)
class InServer:
    """One in-server measurement: statements x rows, committed each or not, from N sessions."""

    label: str
    statements: int
    rows: int
    commit: bool
    sessions: int = 1


IN_SERVER = (
    InServer("stmt", 1000, 1, commit=False),
    InServer("tx x1", 1000, 1, commit=True),
    InServer("tx x4", 400, 1, commit=True, sessions=4),
    InServer(f"batch({BATCH})", 50, BATCH, commit=True),
)


_WAL_NOW = "SELECT pg_current_wal_insert_lsn() - '0/0'"


def _timed(pool, conns: list, statement: str, others: OtherLoad | None) -> tuple[float, float, int]:
    """Run ``statement`` on every connection at once: (seconds, backend CPU s, WAL bytes).

    Repeated (up to RETRIES times) while other people's processes keep the machine busy.
    """
    for attempt in range(1 + RETRIES):
        wal = conns[0].execute(_WAL_NOW).fetchone()[0]
        ours = sum(_backend_cpu(c.info.backend_pid) for c in conns)
        if others:
            others.start()
        start = time.perf_counter()
        # psycopg waits for the server without holding the GIL: threads suffice here.
        list(pool.map(lambda c: c.execute(statement), conns))
        elapsed = time.perf_counter() - start
        ours = sum(_backend_cpu(c.info.backend_pid) for c in conns) - ours
        wal = conns[0].execute(_WAL_NOW).fetchone()[0] - wal
        if not others or others.cores() <= QUIET or attempt == RETRIES:
            return elapsed, ours, wal
    raise AssertionError("unreachable")


@dataclass
class Best:
    """The best of several samples of one in-server measure, each quantity on its own."""

    rate: float = 0.0
    cpu_us: float = float("inf")
    wal_bytes: float = float("inf")

    def add(self, messages: int, seconds: float, cpu: float, wal: int) -> None:
        self.rate = max(self.rate, messages / seconds)
        self.cpu_us = min(self.cpu_us, cpu * 1e6 / messages)
        self.wal_bytes = min(self.wal_bytes, wal / messages)


def server_side(
    database: str, notify: bool, local: bool, repeats: int = 3, publish: str = ""
) -> dict[tuple[str, str], Best]:
    """Every IN_SERVER measure on pgmb_message ("pgmb") and on the baseline ("base")."""
    from concurrent.futures import ThreadPoolExecutor

    import psycopg
    from psycopg import sql as q

    body = q.Literal(json.dumps(_body(1))).as_string(None)
    keys = "[" + ", ".join(q.Literal(k).as_string(None) for k in ROUTING_KEYS) + "]"
    conns = [psycopg.connect(dbname=database, autocommit=True) for _ in range(4)]
    others = OtherLoad(conns[0].info.backend_pid) if local else None
    best: dict[tuple[str, str], Best] = defaultdict(Best)
    try:
        for conn in conns:
            conn.execute(f"SET pgmb.notify = {'on' if notify else 'off'}")
        # Every variant starts just after a checkpoint, so full-page images weigh the same
        # on each; a first pass, not counted, pays for them and for cold caches.
        with contextlib.suppress(psycopg.Error):
            conns[0].execute("CHECKPOINT")
        with ThreadPoolExecutor(4) as pool:
            for repeat in range(1 + repeats):
                for m in IN_SERVER:
                    for side, table in (("pgmb", "pgmb_message"), ("base", BASELINE_TABLE)):
                        insert = (publish if side == "pgmb" and publish else _MESSAGES).format(
                            table=table, keys=keys, body=body, rows=m.rows
                        )
                        statement = _IN_SERVER.format(
                            statements=m.statements,
                            insert=insert,
                            commit="COMMIT;" if m.commit else "",
                        )
                        sample = _timed(pool, conns[: m.sessions], statement, others)
                        if repeat:
                            messages = m.statements * m.rows * m.sessions
                            best[(m.label, side)].add(messages, *sample)
    finally:
        for conn in conns:
            conn.close()
    return best


#: The columns of the variants table: (title, IN_SERVER label, quantity).
_COLUMNS = (
    ("stmt cpu", "stmt", "cpu_us"),
    ("tx cpu", "tx x1", "cpu_us"),
    ("tx x1/s", "tx x1", "rate"),
    ("tx x4/s", "tx x4", "rate"),
    ("batch cpu", f"batch({BATCH})", "cpu_us"),
    ("batch/s", f"batch({BATCH})", "rate"),
    ("WAL B", "tx x1", "wal_bytes"),
)


def investigate(template: str, repeats: int, local: bool) -> None:
    """Measure each variant in the server, each in a fresh copy of ``template``."""
    from django.db import connection

    scratch = f"{template}_scratch"
    try:
        create_database(scratch, template=template)
        explain_batch(scratch)
        print(
            "\nWhere the time goes: each variant alone, in a fresh copy of the database, NOTIFY "
            "off unless named; measured in the server\n(DO blocks: no client, no driver, no "
            f"round trip), best of {repeats}, the baseline table measured alongside.\n"
            "  stmt cpu: backend CPU us per single-message INSERT, all in one transaction;\n"
            "  tx cpu: the same with every INSERT committed; tx x1/s, tx x4/s: msgs/s that way, "
            "from 1 and from 4 sessions at once\n"
            f"  (and ratio to the baseline); batch: {BATCH}-row INSERTs, each committed; WAL B: "
            "WAL bytes per committed message."
        )
        head = f"{'variant':<44}" + "".join(
            f"{title:>10}" if quantity == "cpu_us" else f"{title:>15}"
            for title, _, quantity in _COLUMNS
        )
        print(head)
        print("-" * len(head))
        bases: dict[str, list[float]] = defaultdict(list)
        for variant in VARIANTS + QUEUE_VARIANTS:
            if variant is QUEUE_VARIANTS[0]:
                print(f"{'-- the number of queues (5 above):':<44}")
            create_database(scratch, template=template)
            connection.settings_dict["NAME"] = scratch
            with connection.cursor() as cursor:
                publish = variant.publish(cursor) if variant.publish else ""
                for change in variant.changes:
                    change(cursor)
            connection.close()
            inside = server_side(scratch, variant.notify, local, repeats, publish)
            cells = []
            for title, label, quantity in _COLUMNS:
                pgmb = getattr(inside[(label, "pgmb")], quantity)
                base = getattr(inside[(label, "base")], quantity)
                bases[title].append(base)
                if quantity == "cpu_us":
                    cells.append(f"{pgmb:>10.1f}")
                elif quantity == "rate":
                    cells.append(f"{pgmb:>10,.0f} {pgmb / base:>4.2f}")
                else:
                    cells.append(f"{pgmb:>15,.0f}")
            print(f"{variant.name:<44}" + "".join(cells), flush=True)
        cells = []
        for title, _, quantity in _COLUMNS:
            value = statistics.median(bases[title])
            if quantity == "cpu_us":
                cells.append(f"{value:>10.1f}")
            elif quantity == "rate":
                cells.append(f"{value:>10,.0f}     ")
            else:
                cells.append(f"{value:>15,.0f}")
        print(f"{'baseline table (median over the variants)':<44}" + "".join(cells))
    finally:
        connection.close()
        drop_database(scratch)


# --- Main. ---


def _server_is_local() -> bool:
    """Whether backends' CPU can be read from /proc (the server runs on this machine)."""
    host = os.environ.get("PGHOST", "")
    return host in ("", "localhost", "127.0.0.1", "::1") or host.startswith("/")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="per run (default 1.5)")
    parser.add_argument("--rounds", type=int, default=4, help="runs of each case (default 4)")
    parser.add_argument("--goal", type=float, default=0.8, help="ratio to reach (default 0.8)")
    parser.add_argument("--db", default="pgmb_bench", help="scratch database to create")
    parser.add_argument("--keep", action="store_true", help="do not drop the database")
    parser.add_argument(
        "--extra-queues",
        type=int,
        default=0,
        help="more queues that match nothing, to see routing scale (default 0)",
    )
    parser.add_argument(
        "--investigate", action="store_true", help="also time schema variants (~5 min more)"
    )
    parser.add_argument(
        "--repeats", type=int, default=7, help="of each in-server measure (default 7)"
    )
    args = parser.parse_args(argv)

    os.environ["PGMB_BENCH_DB"] = args.db
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()

    began = time.monotonic()
    create_database(args.db)
    template = f"{args.db}_template"
    clients = None
    try:
        order_queue = set_up(args.extra_queues)
        if args.investigate:
            # A pristine copy (no messages yet) for the variants to start from.
            create_database(template, template=args.db)
        for key, value in machine().items():
            print(f"{key:<9} {value}")
        queues = 1 + len(OTHER_BINDINGS) + args.extra_queues
        print(f"{'queues':<9} {queues}, one of them ({MATCHING_BINDING}) matching every message")
        print(
            f"\nmessages/s: best of {args.rounds} runs of {args.seconds:g} s (range: slowest-"
            f"fastest). ratio = pgmb / baseline (best against best; each run next to a run of "
            f"its baseline); goal >= {args.goal:g}. CPU per message (least of the runs): the "
            "server backends', the client processes'. WAL: bytes written per message.\n"
        )
        clients = Clients(4, local_server=_server_is_local())
        results = run_suite(clients, args.db, MAIN_CASES, args.rounds, args.seconds)
        print_table(results, MAIN_CASES, args.goal)
        foreign = results.foreign()
        print(
            f"\nother people's processes on the machine during the runs: median "
            f"{statistics.median(foreign):.2f} cores, max {max(foreign):.2f}; "
            f"{results.repeated} runs repeated for load above {QUIET} cores"
        )
        clients.close_connections()
        problems = verify(order_queue, results.sent)
        if problems:
            print("\nROUTING CHECK FAILED:\n  " + "\n  ".join(problems))
            return 1
        print(
            f"\nrouting check: {results.sent['pgmb']:,} messages, each delivered once to "
            f"{MATCHING_BINDING} and to no other queue; {results.sent['baseline']:,} baseline "
            f"rows; {time.monotonic() - began:.0f} s"
        )
        if args.investigate:
            clients.stop()
            clients = None
            investigate(template, args.repeats, _server_is_local())
        return 0
    finally:
        if clients is not None:
            clients.stop()
        from django.db import connections

        connections.close_all()
        if args.investigate:
            drop_database(template)
        if not args.keep:
            drop_database(args.db)


if __name__ == "__main__":
    sys.exit(main())
