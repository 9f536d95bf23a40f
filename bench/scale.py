"""Cost as the work grows: each figure with a big table next to the same with a small one.

    scripts/with-cluster.sh .venv/bin/python bench/scale.py [--quick] [--stored 10000000]

A scratch database is migrated and given a worker (a local nginx answering 200, as in
``bench/dispatch.py``) and the five queues of ``bench/publish.py`` (``order.*`` gets every
message, four get nothing); it is then cloned (``CREATE DATABASE ... TEMPLATE``) once per
state to compare, so that a case and its baseline differ only in the size under test:

1. publish: ``INSERT INTO pgmb_message ... SELECT`` of 100 messages (the statement of
   ``bench/pgbench/pgmb_batch.sql``, ids from the column default ``pgmb.uuid_v7()``) from
   one connection, into an empty table against one holding ``--stored`` messages already
   delivered and acked (no delivery rows; no attempt rows either);
2. claim+ack: ``pgmb.deliveries`` claim and ack statements (``claim_call``/``ack_call``),
   100 at a time, from one connection, no HTTP, with a backlog of ``--small-backlog``
   ready deliveries against ``--backlog`` (every 1,000 acked are published again, untimed,
   so the backlog stays within 1,000 of its size);
3. routing: case 1's publish with 5 queues bound against ``--queues`` (all but one
   matching nothing: literal first words, ``*`` first words and ``#`` first words);
4. dispatcher memory: ``manage.py pgmb_dispatch --until-idle`` delivering
   ``--rss-deliveries`` to nginx, its VmRSS sampled from ``/proc``;
5. the hot table: ``pgmb_delivery``'s size before that backlog, full, drained (the
   dispatcher's housekeeping, ``pgmb.housekeeping``, ran as it went idle, unless
   ``--no-dispatcher-housekeeping``), after autovacuum (as the cluster configures it), after
   ``VACUUM``, after ``manage.py pgmb_housekeeping`` and after ``REINDEX``;
6. retention: ``--retention-stored`` messages (default ``--stored``) published over
   ``--retention-days`` days, each with its ack attempt, all finished, in their day
   partitions (``pgmb.make_history_days``); the first full UTC day's messages and attempts
   leave as the archive job deletes them (``delete_batch`` of
   ``pgmb/sql/queries/archive.sql``, transactions of the job's default batch size, after an
   untimed claim of the day into a written run), the next day's as ``pgmb.retire_history``
   drops its partitions; each timed once, end to end;
7. stored history (``--history-only``, alone): case 1's publish and case 2's claim+ack in a
   database holding ``--stored`` finished messages, each with its ack attempt, published over
   ``--history-days`` days into their day partitions, against an empty one; both with the
   partitions the broker's housekeeping premakes (``pgmb.premake_history``) and the same
   backlog of ``--small-backlog`` ready deliveries. Afterwards every message published since
   the fill is routed once (a delivery, or the ack attempt it left) and no delivery is leased:

       scripts/with-cluster.sh .venv/bin/python bench/scale.py --history-only \\
           --stored 10000000 --rounds 4 --seconds 2

Cases 1-3 and 7 run in rounds next to their baseline (``bench/harness.py``); the best run of
each counts (``--hot-table-only``: only cases 4 and 5; ``--retention-only``: only case 6;
``--history-only``: only case 7). Every clone is dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import endpoints, harness, publish  # noqa: E402

QUEUE = "order_queue"
BATCH = 100
CONCURRENCY = 64
UNLIMITED_RPS = 1_000_000
FILL_CHUNK = 1_000_000
#: Claim+ack runs publish this many again each time they have acked as many.
REFILL = 1_000

#: One publish: 100 messages, keys and ids as producers' would be (bench/pgbench/pgmb_batch.sql).
PUBLISH = """
INSERT INTO pgmb_message (routing_key, body)
SELECT (%(keys)s::text[])[1 + g %% 3], %(body)s::jsonb
FROM generate_series(1, %(count)s) AS g
"""

#: Messages delivered and acked long ago: no delivery rows, so the routing trigger is off
#: (session_replication_role = replica). Ids are uuid_v7 of created_at, one every 10 ms,
#: so they sort as pgmb.uuid_v7() makes them and all before any message published later.
STORED = """
INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at)
SELECT encode(set_bit(set_bit(
           overlay(uuid_send(gen_random_uuid())
                   PLACING substring(int8send(floor(extract(epoch FROM t) * 1000)::bigint) FROM 3)
                   FROM 1 FOR 6),
           52, 1), 53, 1), 'hex')::uuid,
       (%(keys)s::text[])[1 + g %% 3],
       jsonb_build_object('order_id', g, 'customer', 'c-' || lpad((g %% 9973)::text, 5, '0'),
                          'total', '129.90', 'currency', 'EUR',
                          'lines', '[{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}]'::jsonb),
       '{}', t, t
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g,
     LATERAL (SELECT now() - (%(total)s - g) * %(spacing_ms)s * interval '1 ms') AS s(t)
"""

#: Case 6: one ack attempt for each stored message of ids ``[low, high)``, at its publication.
ACKED = """
INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms,
                          error, created_at)
SELECT m.id, %(queue)s, 1, 'ack', 200, 1.0, '', m.created_at
FROM pgmb_message m
WHERE m.id > %(low)s
"""

#: Case 6, untimed: a UTC day's messages claimed by a written archive run.
CLAIM_DAY = """
WITH run AS (
    INSERT INTO pgmb_archive_run (output, cutoff, state, messages)
    VALUES ('bench', now(), 'written', 0)
    RETURNING id
)
INSERT INTO pgmb_archive_item (run_id, message_id)
SELECT run.id, m.id FROM run, pgmb_message m
WHERE m.id >= pgmb.day_floor(%(day)s) AND m.id < pgmb.day_floor(%(day)s + 1)
RETURNING run_id
"""

#: Case 6: the days up to and including ``day`` retired (pgmb.retire_history, not counting:
#: the bench counts the day's rows before, untimed).
RETIRE_UP_TO = """
SELECT day, messages, attempts, kept
FROM pgmb.retire_history(now() - (%(day)s::date + 1)::timestamp AT TIME ZONE 'UTC')
"""

SIZES = """
SELECT pg_relation_size('pgmb_delivery'), pg_indexes_size('pgmb_delivery'),
       pg_total_relation_size('pgmb_delivery')
"""


# --- The databases. ---


def _admin() -> psycopg.Connection[Any]:
    return harness.connect(os.environ.get("PGDATABASE", "postgres"))


@contextlib.contextmanager
def clones(template: str, names: Sequence[str], keep: bool) -> Iterator[dict[str, str]]:
    """Copies of ``template`` (which nobody may be connected to); suffix -> database name."""
    from django.db import connections

    connections.close_all()
    made = {name: f"{template}_{name}" for name in names}
    try:
        with _admin() as admin:
            for database in made.values():
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(database)
                    )
                )
                admin.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                        sql.Identifier(database), sql.Identifier(template)
                    )
                )
        yield made
    finally:
        if not keep:
            with _admin() as admin:
                for database in made.values():
                    admin.execute(
                        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                            sql.Identifier(database)
                        )
                    )


def set_up(url: str) -> None:
    """In the template: the worker and the five queues of bench/publish.py."""
    from pgmb.models import Queue, Worker

    worker = Worker.objects.create(name="bench", endpoint=url, rps=UNLIMITED_RPS)
    Queue.objects.create(name=QUEUE, binding_key=publish.MATCHING_BINDING, worker=worker)
    for name, binding in publish.OTHER_BINDINGS.items():
        Queue.objects.create(name=name, binding_key=binding, worker=worker)


def extra_bindings(count: int, literal_only: bool = False) -> list[str]:
    """Bindings that match none of bench/publish.py's keys, a third of each kind (or all
    with a literal first word).

    None of them shares a word at its place with ``order.*`` keys, so the routing tags
    (pgmb/sql/schema/routing.sql) take none of them to the regex; ``*.svc{n}.created``
    shares the word ``created`` at another place, which tags by place tell apart.
    """
    kinds = ("svc{}.*.#",) if literal_only else ("svc{}.*.#", "*.svc{}.created", "#.svc{}")
    return [kinds[n % len(kinds)].format(n) for n in range(count)]


def add_queues(conn: psycopg.Connection[Any], bindings: Sequence[str]) -> None:
    (worker,) = conn.execute("SELECT id FROM pgmb_worker WHERE name = 'bench'").fetchone()
    with conn.transaction():
        for n, binding in enumerate(bindings):
            conn.execute("SELECT pgmb.create(%s, %s, %s::uuid, 5)", (f"extra_{n}", binding, worker))


def _publish_params(count: int) -> dict[str, Any]:
    return {
        "keys": list(publish.ROUTING_KEYS),
        "body": json.dumps(publish.order_event(1)),
        "count": count,
    }


def fill_stored(
    conn: psycopg.Connection[Any], total: int, spacing_ms: float = 10.0, acked: bool = False
) -> None:
    """``total`` old messages ``spacing_ms`` apart (the last one now) with no deliveries, in
    chunks, each with its ack attempt if ``acked``; then vacuumed as autovacuum would."""
    began = time.monotonic()
    # The day partitions of the days the fill spans, as a broker running that long has.
    conn.execute(
        "SELECT pgmb.make_history_days(((now() - %s * interval '1 ms') AT TIME ZONE 'UTC')::date,"
        " (now() AT TIME ZONE 'UTC')::date, NULL)",
        (total * spacing_ms,),
    )
    conn.execute("SET session_replication_role = replica")
    (queue,) = conn.execute("SELECT id FROM pgmb_queue WHERE name = %s", (QUEUE,)).fetchone()
    for first in range(1, total + 1, FILL_CHUNK):
        last = min(total, first + FILL_CHUNK - 1)
        params = {
            "keys": list(publish.ROUTING_KEYS),
            "first": first,
            "last": last,
            "total": total,
            "spacing_ms": spacing_ms,
        }
        low = last_message(conn)
        conn.execute(STORED, params)
        if acked:
            conn.execute(ACKED, {"queue": queue, "low": low})
        print(f"  stored {last:,} of {total:,} ({time.monotonic() - began:.0f} s)", flush=True)
    conn.execute("RESET session_replication_role")
    conn.execute("VACUUM (ANALYZE) pgmb_attempt")
    settle(conn)


def fill_backlog(conn: psycopg.Connection[Any], total: int) -> None:
    """``total`` messages published and routed: ``total`` ready deliveries."""
    began = time.monotonic()
    for done in range(0, total, FILL_CHUNK):
        count = min(FILL_CHUNK, total - done)
        conn.execute(PUBLISH, _publish_params(count))
        print(f"  routed {done + count:,} of {total:,} ({time.monotonic() - began:.0f} s)")
    settle(conn)


def settle(conn: psycopg.Connection[Any]) -> None:
    """What a table filled over days would have had: vacuumed, analysed; then a checkpoint,
    so that the fill's dirty pages are not written during the runs."""
    conn.execute("VACUUM (ANALYZE) pgmb_message")
    conn.execute("VACUUM (ANALYZE) pgmb_delivery")
    # The queues just added: routing is planned by their number (autovacuum analyses the
    # table after that many inserts within a minute; a run does not wait for it).
    conn.execute("VACUUM (ANALYZE) pgmb_queue")
    conn.execute("CHECKPOINT")


def rows(conn: psycopg.Connection[Any], table: str) -> int:
    (count,) = conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
    ).fetchone()
    return int(count)


# --- 1 and 3: publishing. ---


def publish_case(label: str, conn: psycopg.Connection[Any], seconds: float) -> harness.Case:
    params = _publish_params(BATCH)

    def run() -> harness.Sample:
        backend = conn.info.backend_pid
        server, count = harness.backend_cpu(backend), 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            conn.execute(PUBLISH, params)
            count += BATCH
        elapsed = time.perf_counter() - start
        return {
            "rate": count / elapsed,
            "server_us": (harness.backend_cpu(backend) - server) / count * 1e6,
        }

    return harness.Case(label, run)


#: Messages after ``since`` and what routing made of each: a delivery, or the ack attempt
#: its delivery left when it was claimed and acked (pgmb.ack).
ROUTED = """
WITH routed AS (
    SELECT message_id, queue_id FROM pgmb_delivery WHERE message_id > %(since)s
    UNION ALL
    SELECT message_id, queue_id FROM pgmb_attempt
    WHERE message_id > %(since)s AND outcome = 'ack'
), per_message AS (
    SELECT message_id, count(*) FILTER (WHERE queue_id = q.id) AS ours,
           count(*) FILTER (WHERE queue_id <> q.id) AS others
    FROM routed, (SELECT id FROM pgmb_queue WHERE name = %(queue)s) AS q
    GROUP BY message_id
)
SELECT count(*), coalesce(sum(p.ours), 0), coalesce(sum(p.others), 0),
       count(*) FILTER (WHERE coalesce(p.ours, 0) <> 1)
FROM pgmb_message m LEFT JOIN per_message p ON p.message_id = m.id
WHERE m.id > %(since)s
"""

NO_MESSAGE = "00000000-0000-0000-0000-000000000000"


def last_message(conn: psycopg.Connection[Any]) -> str:
    """The greatest message id stored (the nil UUID when there is none): messages published
    from now on come after it."""
    (last,) = conn.execute(
        "SELECT coalesce((SELECT id FROM pgmb_message ORDER BY id DESC LIMIT 1), %s::uuid)",
        (NO_MESSAGE,),
    ).fetchone()
    return str(last)


def routing_problems(
    conn: psycopg.Connection[Any], name: str, since: str = NO_MESSAGE
) -> list[str]:
    """Every message after ``since`` (all by default) routed once, to the order.* queue only:
    a delivery, or its ack attempt once claimed and acked."""
    messages, ours, others, not_once = conn.execute(
        ROUTED, {"since": since, "queue": QUEUE}
    ).fetchone()
    problems = []
    if others:
        problems.append(f"{name}: {others:,} deliveries to queues that must match nothing")
    if ours != messages or not_once:
        problems.append(
            f"{name}: {ours:,} deliveries to {QUEUE} for {messages:,} messages,"
            f" {not_once:,} of them not routed once"
        )
    return problems


# --- 2: claim and ack. ---


def _run(conn: psycopg.Connection[Any], call: Any) -> Any:
    """A pgmb.deliveries call on a plain psycopg connection (autocommit: one commit each)."""
    cursor = conn.execute(call.query, call.params)
    names = [c.name for c in cursor.description] if cursor.description else []
    return call.read(names, cursor.fetchall() if cursor.description else [])


def claim_ack_case(label: str, conn: psycopg.Connection[Any], seconds: float) -> harness.Case:
    """Claim and ack for ``seconds`` of their own time; every ``REFILL`` deliveries acked,
    as many are published again (not timed), so the backlog stays within REFILL of its size."""
    from pgmb import deliveries

    def run() -> harness.Sample:
        backend = conn.info.backend_pid
        done, elapsed, server = 0, 0.0, 0.0
        while elapsed < seconds:
            cpu, start = harness.backend_cpu(backend), time.perf_counter()
            for _ in range(REFILL // BATCH):
                claims = _run(conn, deliveries.claim_call([QUEUE], BATCH))
                if len(claims) < BATCH:
                    raise RuntimeError(f"{label}: the backlog ran dry")
                successes = [deliveries.Success(c.delivery_id, 200, 1.0) for c in claims]
                if _run(conn, deliveries.ack_call(successes)) != len(claims):
                    raise RuntimeError(f"{label}: fewer acks than claims")
            elapsed += time.perf_counter() - start
            server += harness.backend_cpu(backend) - cpu
            done += REFILL
            conn.execute(PUBLISH, _publish_params(REFILL))
        return {"rate": done / elapsed, "server_us": server / done * 1e6}

    return harness.Case(label, run)


# --- 4 and 5: the dispatcher's memory, the hot table's size. ---


def vm_rss(pid: int) -> float | None:
    """Resident memory of a process in MB (None once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


@dataclass
class Drain:
    deliveries: int
    seconds: float
    #: (deliveries acked so far, MB), one sample each 0.5 s.
    rss: list[tuple[int, float]]
    other_cores: float


def drain(database: str, total: int, housekeeping: bool) -> Drain:
    """``pgmb_dispatch --until-idle`` over the backlog; its memory as it goes."""
    env = {**os.environ, "PGMB_BENCH_DB": database}
    if not housekeeping:
        env["PGMB_BENCH_HOUSEKEEPING_INTERVAL"] = "0"
    argv = [sys.executable, "-m", "django", "pgmb_dispatch", "--concurrency", str(CONCURRENCY),
            "--until-idle", "--queue", QUEUE, "-v", "0"]  # fmt: skip
    deleted = "SELECT n_tup_del FROM pg_stat_user_tables WHERE relname = 'pgmb_delivery'"
    samples: list[tuple[int, float]] = []
    load = harness.OtherLoad(harness.postmaster())
    with harness.connect(database) as conn:
        (before,) = conn.execute(deleted).fetchone()
        start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env)
        while proc.poll() is None:
            mb = vm_rss(proc.pid)
            (now,) = conn.execute(deleted).fetchone()
            if mb is not None:
                samples.append((now - before, mb))
            time.sleep(0.5)
        seconds = time.perf_counter() - start
        if proc.returncode:
            raise RuntimeError(f"pgmb_dispatch exited with {proc.returncode}")
        left = rows(conn, "pgmb_delivery")
        (acked,) = conn.execute(
            "SELECT count(*) FROM pgmb_attempt WHERE outcome = 'ack'"
        ).fetchone()
    if left or acked != total:
        raise RuntimeError(f"dispatch check failed: {acked:,} acks of {total:,}, {left:,} left")
    return Drain(total, seconds, samples, load.cores())


def sizes(conn: psycopg.Connection[Any]) -> tuple[int, int, int]:
    heap, indexes, total = conn.execute(SIZES).fetchone()
    return heap, indexes, total


def autovacuumed(conn: psycopg.Connection[Any], after: Any, wait: float) -> Any:
    """When autovacuum last finished on pgmb_delivery after ``after`` (None: not in ``wait`` s)."""
    deadline = time.monotonic() + wait
    while True:
        (last,) = conn.execute(
            "SELECT last_autovacuum FROM pg_stat_user_tables WHERE relname = 'pgmb_delivery'"
        ).fetchone()
        if last is not None and last > after:
            return last
        if time.monotonic() >= deadline:
            return None
        time.sleep(1)


def housekept(database: str) -> str:
    """``manage.py pgmb_housekeeping``: what it reported."""
    env = {**os.environ, "PGMB_BENCH_DB": database}
    argv = [sys.executable, "-m", "django", "pgmb_housekeeping"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return done.stdout


def memory_and_hot_table(database: str, total: int, wait: float, housekeeping: bool) -> None:
    mb = 1024 * 1024
    table: list[tuple[str, tuple[int, int, int]]] = []
    with harness.connect(database) as conn:
        table.append(("empty, before the backlog", sizes(conn)))
        fill_backlog(conn, total)
        table.append((f"{total:,} ready deliveries", sizes(conn)))
        (counted_before,) = conn.execute(
            "SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'pgmb_delivery'"
        ).fetchone()
    result = drain(database, total, housekeeping)
    with harness.connect(database) as conn:
        (drained_at, counted) = conn.execute(
            "SELECT now(), autovacuum_count FROM pg_stat_user_tables"
            " WHERE relname = 'pgmb_delivery'"
        ).fetchone()
        table.append(
            (
                "drained, dispatcher exited "
                + ("(its housekeeping ran)" if housekeeping else "(no housekeeping)"),
                sizes(conn),
            )
        )
        last = autovacuumed(conn, drained_at, wait)
        table.append(
            (
                f"then autovacuum ({'ran' if last else f'had not run after {wait:g} s'})",
                sizes(conn),
            )
        )
        conn.execute("VACUUM pgmb_delivery")
        table.append(("then VACUUM pgmb_delivery", sizes(conn)))
        report = housekept(database)
        table.append(("then manage.py pgmb_housekeeping", sizes(conn)))
        conn.execute("REINDEX TABLE CONCURRENTLY pgmb_delivery")
        table.append(("then REINDEX TABLE CONCURRENTLY", sizes(conn)))
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('autovacuum',"
                " 'autovacuum_naptime', 'autovacuum_vacuum_scale_factor',"
                " 'autovacuum_vacuum_threshold', 'autovacuum_vacuum_cost_limit',"
                " 'autovacuum_vacuum_cost_delay')"
            ).fetchall()
        )

    # Before the first ack the process is still importing: its start is its first delivery.
    samples = [(n, m) for n, m in result.rss if n > 0] or result.rss
    warm = next((m for n, m in samples if n >= total * 0.05), samples[0][1])
    end, peak = samples[-1][1], max(m for _, m in samples)
    growth = end - warm
    print(
        f"\n4. Dispatcher memory: pgmb_dispatch --until-idle, {CONCURRENCY} in flight, "
        f"{total:,} deliveries to nginx in {result.seconds:.0f} s "
        f"({total / result.seconds:,.0f}/s); VmRSS every 0.5 s against the deliveries acked so "
        "far (pg_stat_user_tables, up to 1 s late); every delivery acked."
    )
    print("  deliveries acked   VmRSS MB")
    shown = -1
    for n, m in samples:
        step = int(10 * n / total)
        if step > shown or (n, m) == samples[-1]:
            print(f"  {n:>16,} {m:>10.1f}")
            shown = step
    print(
        f"  first delivery {samples[0][1]:.1f} MB, after 5 % (warm) {warm:.1f} MB, "
        f"end {end:.1f} MB, "
        f"max {peak:.1f} MB; growth warm to end {growth:+.1f} MB: goal < 20 MB "
        + ("met" if growth < 20 else "NOT MET")
    )
    print(f"  During the drain, other processes kept {result.other_cores:.2f} cores busy.")

    print(
        f"\n5. The hot table: pgmb_delivery (MB), autovacuum ran {counted - counted_before} "
        f"times during the drain. Autovacuum: "
        + ", ".join(f"{k.removeprefix('autovacuum_')}={v}" for k, v in sorted(settings.items()))
    )
    print(f"  {'':<52} {'heap':>8} {'indexes':>8} {'total':>8}")
    for label, (heap, indexes, all_) in table:
        print(f"  {label:<52} {heap / mb:>8.2f} {indexes / mb:>8.2f} {all_ / mb:>8.2f}")
    print("  manage.py pgmb_housekeeping said:\n    " + report.strip().replace("\n", "\n    "))


# --- 6: retention. ---


@dataclass
class Retention:
    stored: int
    days: float
    #: The archive job's deletes of one full day (delete_batch): rows and seconds.
    deleted: int
    deleted_attempts: int
    transactions: int
    delete_seconds: float
    #: pgmb.retire_history of the next full day: rows and seconds.
    dropped: int
    dropped_attempts: int
    drop_seconds: float


def retention(database: str, total: int, days: float) -> Retention:
    """Two full UTC days of ``days`` days of ``total`` finished messages leave: the first
    as the archive job deletes a written run (``delete_batch`` until nothing is left, one
    transaction each), the next as ``pgmb.retire_history`` drops its partitions."""
    from pgmb import sql as pgmb_sql
    from pgmb.pipeline.archive import DEFAULT_BATCH_SIZE

    delete = pgmb_sql.query("archive.sql", "delete_batch")
    with harness.connect(database) as conn:
        print(f"\nFilling (not timed): {total:,} messages over {days:g} days, each acked")
        fill_stored(conn, total, spacing_ms=days * 86_400_000 / total, acked=True)
        (first,) = conn.execute(
            "SELECT (min(created_at) AT TIME ZONE 'UTC')::date FROM pgmb_message"
        ).fetchone()
        # The first day is partial: out of the way, untimed.
        conn.execute(RETIRE_UP_TO, {"day": first})
        deleted_day, dropped_day = first + timedelta(days=1), first + timedelta(days=2)
        claimed = conn.execute(CLAIM_DAY, {"day": deleted_day}).fetchall()
        run = claimed[0][0]
        conn.execute("CHECKPOINT")
        deleted = deleted_attempts = transactions = 0
        start = time.perf_counter()
        while True:
            items, gone, gone_attempts = conn.execute(
                delete, {"run": run, "limit": DEFAULT_BATCH_SIZE}
            ).fetchone()
            transactions += 1
            deleted += gone
            deleted_attempts += gone_attempts
            if items < DEFAULT_BATCH_SIZE:
                break
        delete_seconds = time.perf_counter() - start
        conn.execute(RETIRE_UP_TO, {"day": deleted_day})  # its tables, empty now
        (dropped, dropped_attempts) = conn.execute(
            sql.SQL("SELECT (SELECT count(*) FROM {}), (SELECT count(*) FROM {})").format(
                sql.Identifier(f"pgmb_message_p{dropped_day:%Y%m%d}"),
                sql.Identifier(f"pgmb_attempt_p{dropped_day:%Y%m%d}"),
            )
        ).fetchone()
        conn.execute("CHECKPOINT")
        start = time.perf_counter()
        retired = conn.execute(RETIRE_UP_TO, {"day": dropped_day}).fetchall()
        drop_seconds = time.perf_counter() - start
    if deleted != len(claimed) or deleted_attempts != len(claimed):
        raise RuntimeError(
            f"retention check failed: {deleted:,} messages and {deleted_attempts:,} attempts"
            f" deleted of {len(claimed):,}"
        )
    if [(d, kept) for d, _, _, kept in retired] != [(dropped_day, 0)]:
        raise RuntimeError(f"retention check failed: retired {retired}")
    return Retention(
        total, days, deleted, deleted_attempts, transactions, delete_seconds,
        dropped, dropped_attempts, drop_seconds,
    )  # fmt: skip


def print_retention(result: Retention) -> None:
    print(
        f"\n6. Retention of a full UTC day of {result.stored:,} finished messages over "
        f"{result.days:g} days (each with its ack attempt):"
    )
    print(
        f"  the archive job's deletes (delete_batch, {result.transactions:,} transactions): "
        f"{result.deleted:,} messages and {result.deleted_attempts:,} attempts in "
        f"{result.delete_seconds:.2f} s"
    )
    print(
        f"  pgmb.retire_history, the next day's partitions dropped: {result.dropped:,} "
        f"messages and {result.dropped_attempts:,} attempts in {result.drop_seconds:.3f} s; "
        "goal < 1 s " + ("met" if result.drop_seconds < 1 else "NOT MET")
    )


# --- 7: publish and claim+ack next to stored history. ---


def lease_problems(conn: psycopg.Connection[Any], name: str) -> list[str]:
    """Claims that every ack settled leave no delivery leased."""
    (leased,) = conn.execute(
        "SELECT count(*) FROM pgmb_delivery WHERE state = 'leased' OR lease_id IS NOT NULL"
    ).fetchone()
    return [f"{name}: {leased:,} deliveries still leased"] if leased else []


def history_cases(db: dict[str, str], args: argparse.Namespace) -> list[str]:
    """Case 7: publish and claim+ack in a database holding ``--stored`` finished messages
    over ``--history-days`` days next to an empty one, both with the same small backlog;
    routing and lease problems found."""
    conns = {name: harness.connect(db[name]) for name in ("empty", "stored")}
    try:
        for conn in conns.values():
            # Today's partitions and the next days', as the broker's housekeeping makes them.
            conn.execute("SELECT pgmb.premake_history()")
        days = args.history_days
        print(f"\nFilling: {args.stored:,} messages over {days:g} days, each acked", flush=True)
        began = time.monotonic()
        fill_stored(conns["stored"], args.stored, days * 86_400_000 / args.stored, acked=True)
        filled = time.monotonic() - began
        print(f"  filled in {filled:.0f} s", flush=True)
        since = {name: last_message(conn) for name, conn in conns.items()}
        print(f"Backlogs: {args.small_backlog:,} in each", flush=True)
        for conn in conns.values():
            fill_backlog(conn, args.small_backlog)
        # Statements that join pgmb_message without a constant id plan and lock every one
        # of its partitions: their number, more than its rows, is what history adds.
        partitions = {
            name: conn.execute(
                "SELECT count(*) FROM pg_inherits WHERE inhparent = 'pgmb_message'::regclass"
            ).fetchone()[0]
            for name, conn in conns.items()
        }
        load = harness.OtherLoad(harness.postmaster())
        s = args.seconds
        results = harness.measure(
            [
                (
                    publish_case("empty", conns["empty"], s),
                    publish_case("stored", conns["stored"], s),
                ),
                (
                    claim_ack_case("empty claim", conns["empty"], s),
                    claim_ack_case("stored claim", conns["stored"], s),
                ),
            ],
            args.rounds,
            load,
        )
        print(
            f"\n7. Stored history: {args.stored:,} finished messages over {days:g} days, each "
            f"with its ack attempt, in their day partitions (filled in {filled:.0f} s; "
            f"pgmb_message has {partitions['stored']} partitions, the empty database's "
            f"{partitions['empty']}), against an empty database; both with a backlog of "
            f"{args.small_backlog:,} ready. "
            f"Publishing: INSERT ... SELECT of {BATCH}; claim+ack: batches of {BATCH} through "
            f"pgmb.deliveries' statements, the backlog refilled after each {REFILL:,}; one "
            f"connection, {args.rounds} runs of {s:g} s; best run; ratio to the empty database."
            " CPU: the server backend's per message (least)."
        )
        stored = f"{args.stored:,} stored over {days:g} days"
        harness.print_table(
            results,
            (
                harness.Row("publish, empty", "empty"),
                harness.Row(f"publish, {stored}", "stored", "rate", "empty", args.goal),
                harness.Row("claim+ack, empty", "empty claim"),
                harness.Row(
                    f"claim+ack, {stored}", "stored claim", "rate", "empty claim", args.goal
                ),
            ),
            harness.best,
            (harness.Column("server us/msg", "server_us", harness.least),),
        )
        return [
            p
            for name, conn in conns.items()
            for p in routing_problems(conn, name, since[name]) + lease_problems(conn, name)
        ]
    finally:
        for conn in conns.values():
            conn.close()


# --- Main. ---


def cases_1_to_3(db: dict[str, str], names: Sequence[str], args: argparse.Namespace) -> list[str]:
    """Publishing, claim+ack and routing next to their baselines; routing problems found."""
    base_queues = 1 + len(publish.OTHER_BINDINGS)
    conns = {name: harness.connect(db[name]) for name in names if name not in ("rss", "retention")}
    try:
        print(f"\nFilling (not timed): {args.stored:,} stored messages", flush=True)
        fill_stored(conns["stored"], args.stored)
        print(f"Backlogs: {args.small_backlog:,} and {args.backlog:,}", flush=True)
        fill_backlog(conns["small"], args.small_backlog)
        fill_backlog(conns["large"], args.backlog)
        extra = args.queues - base_queues
        add_queues(conns["routing"], extra_bindings(extra))
        add_queues(conns["literal"], extra_bindings(extra, literal_only=True))
        for name in ("empty", "routing", "literal"):
            settle(conns[name])
        load = harness.OtherLoad(harness.postmaster())
        s = args.seconds
        publishing = (
            publish_case("empty", conns["empty"], s),
            publish_case("stored", conns["stored"], s),
            publish_case("routing", conns["routing"], s),
            publish_case("literal", conns["literal"], s),
        )
        claiming = (
            claim_ack_case("small", conns["small"], s),
            claim_ack_case("large", conns["large"], s),
        )
        results = harness.measure([publishing, claiming], args.rounds, load)
        print(
            f"\n1 and 3. Publishing, INSERT ... SELECT of {BATCH} messages from one "
            f"connection, {args.rounds} runs of {s:g} s; best run; ratio to the empty "
            "table with 5 queues. CPU: the server backend's per message (least)."
        )
        cpu = (harness.Column("server us/msg", "server_us", harness.least),)
        harness.print_table(
            results,
            (
                harness.Row("empty table, 5 queues", "empty"),
                harness.Row(
                    f"{args.stored:,} messages stored", "stored", "rate", "empty", args.goal
                ),
                harness.Row(
                    f"{args.queues:,} queues bound (mix)",
                    "routing",
                    "rate",
                    "empty",
                    args.goal,
                ),
                harness.Row(
                    f"{args.queues:,} queues bound, literal first words",
                    "literal",
                    "rate",
                    "empty",
                    args.goal,
                ),
            ),
            harness.best,
            cpu,
        )
        print(
            f"\n2. Claim+ack, batches of {BATCH} through pgmb.deliveries' statements "
            f"from one connection, {args.rounds} runs of {s:g} s, the backlog refilled "
            "after each; best run; ratio to the small backlog."
        )
        harness.print_table(
            results,
            (
                harness.Row(f"backlog {args.small_backlog:,} ready", "small"),
                harness.Row(f"backlog {args.backlog:,} ready", "large", "rate", "small", args.goal),
            ),
            harness.best,
            cpu,
        )
        problems = [
            p
            for name in ("empty", "routing", "literal")
            for p in routing_problems(conns[name], name)
        ]
    finally:
        for conn in conns.values():
            conn.close()
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a check, not figures")
    parser.add_argument("--stored", type=int, default=10_000_000, help="messages already stored")
    parser.add_argument("--backlog", type=int, default=1_000_000, help="ready deliveries, large")
    parser.add_argument("--small-backlog", type=int, default=10_000, help="its baseline")
    parser.add_argument("--queues", type=int, default=1_000, help="queues bound (baseline 5)")
    parser.add_argument("--rss-deliveries", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=2.0, help="per run (default 2)")
    parser.add_argument("--rounds", type=int, default=4, help="runs of each case (default 4)")
    parser.add_argument("--autovacuum-wait", type=float, default=120.0, help="seconds at most")
    parser.add_argument("--goal", type=float, default=0.8, help="ratio to reach (default 0.8)")
    parser.add_argument("--db", default="pgmb_bench_scale", help="scratch database to create")
    parser.add_argument("--keep", action="store_true", help="do not drop the databases")
    parser.add_argument(
        "--hot-table-only", action="store_true", help="only cases 4 and 5 (memory, hot table)"
    )
    parser.add_argument("--retention-only", action="store_true", help="only case 6 (retention)")
    parser.add_argument(
        "--retention-stored", type=int, help="messages for case 6 (default --stored)"
    )
    parser.add_argument(
        "--retention-days", type=float, default=10.0, help="days they span (default 10)"
    )
    parser.add_argument(
        "--history-only",
        action="store_true",
        help="only case 7 (publish and claim+ack next to --stored messages of history)",
    )
    parser.add_argument(
        "--history-days", type=float, default=10.0, help="days case 7's messages span (10)"
    )
    parser.add_argument(
        "--no-dispatcher-housekeeping",
        dest="dispatcher_housekeeping",
        action="store_false",
        help="drain with PGMB['HOUSEKEEPING_INTERVAL'] = 0 (case 5 then shows the command)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.stored, args.backlog, args.small_backlog = 50_000, 50_000, 2_000
        args.queues, args.rss_deliveries = 100, 20_000
        args.seconds, args.rounds, args.autovacuum_wait = 0.5, 1, 0.0
    if args.retention_stored is None:
        args.retention_stored = args.stored
    base_queues = 1 + len(publish.OTHER_BINDINGS)
    if (
        args.queues <= base_queues
        or min(args.stored, args.backlog) < 1
        or args.small_backlog < 2 * REFILL
    ):
        parser.error(
            f"--queues must exceed {base_queues}, --small-backlog must be at least {2 * REFILL}"
        )

    began = time.monotonic()
    names = ("empty", "stored", "routing", "literal", "small", "large", "rss", "retention")
    if args.hot_table_only:
        names = ("rss",)
    elif args.retention_only:
        names = ("retention",)
    elif args.history_only:
        names = ("empty", "stored")
    with (
        endpoints.fast_endpoint() as fast,
        harness.scratch_database(args.db, args.keep),
    ):
        set_up(fast.url())
        with clones(args.db, names, args.keep) as db:
            sizes = (
                f"stored {args.stored:,}, backlog {args.small_backlog:,} vs "
                f"{args.backlog:,}, queues 5 vs {args.queues:,}, "
                f"rss deliveries {args.rss_deliveries:,}"
            )
            if args.history_only:
                sizes = (
                    f"stored {args.stored:,} acked over {args.history_days:g} days vs none, "
                    f"backlog {args.small_backlog:,}"
                )
            harness.print_machine(
                endpoint=f"{fast.describe()} on 127.0.0.1, answering 200", sizes=sizes
            )
            if args.history_only:
                problems = history_cases(db, args)
            elif args.hot_table_only or args.retention_only:
                problems = []
            else:
                problems = cases_1_to_3(db, names, args)
            if not (args.retention_only or args.history_only):
                memory_and_hot_table(
                    db["rss"],
                    args.rss_deliveries,
                    args.autovacuum_wait,
                    args.dispatcher_housekeeping,
                )
            if not (args.hot_table_only or args.history_only):
                print_retention(
                    retention(db["retention"], args.retention_stored, args.retention_days)
                )
    if problems:
        print("\nROUTING CHECK FAILED:\n  " + "\n  ".join(problems))
        return 1
    checked = "" if args.hot_table_only or args.retention_only else "routing check passed; "
    if args.history_only:
        checked = "routing and lease check passed; "
    print(f"\n{checked}took {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
