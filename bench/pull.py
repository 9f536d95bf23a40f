"""Consuming a pull queue through SQL, driven by pgbench: pgmb against a plain table and PGMQ.

    scripts/with-cluster.sh .venv/bin/python bench/pull.py [--seconds 2] [--rounds 4]
        [--pgmq-sql path/to/pgmq.sql]

In a scratch database with two pull queues (no worker), ``pullq`` keeping its history and
``pullq_bare`` keeping none (keep_history off; bound to other routing keys), a plain table
``bench_pull_baseline`` and, when its SQL is given (``--pgmq-sql`` or ``$PGMQ_SQL``, see
bench/pgmq_sql.py), PGMQ with its queue ``q``, each run fills its queue with ``--size``
messages (the plain table four times as many; the same body, bench/publish.py's order
event), vacuums, then pgbench runs one transaction in a loop from 4 clients (and from 1):

* the plain table (the physical limit): the 100 oldest rows, ``FOR UPDATE SKIP LOCKED``,
  deleted in one statement
* pgmb: ``pgmb.delete('pullq', ARRAY(SELECT delivery_id FROM pgmb.read('pullq', 30, 100)))``,
  its delete keeping an ``ack`` row in the history
* pgmb without history: the same on ``pullq_bare``, whose delete only deletes, as PGMQ's
* PGMQ: ``pgmq.delete('q', ARRAY(SELECT msg_id FROM pgmq.read('q', 30, 100)))``
* PGMQ keeping what it consumed: the same with ``pgmq.archive`` (moved to its archive
  table), as pgmb's delete keeps an ``ack`` row in its history.

The cases of a table run next to each other, their order rotating between rounds; the
best of ``--rounds`` counts. pgmb's goals, against PGMQ's read + delete: ``--goal-bare``
(0.8) without history, ``--goal`` (0.6) with it; without PGMQ both are held against the
plain table alone, with no goal, and the output says so. After each run
the queue must hold exactly what pgbench did not consume (100 a transaction, none read
twice): the exit status is 1 if not, if a run emptied its queue (raise ``--size``) or if
the PGMQ file given does not load, never for a missed ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness, pgbench_runner, pgmq_sql, publish  # noqa: E402

PULL_QUEUE = "pullq"  # the name bench/pgbench/pgmb_read_delete.sql reads
#: The queue of bench/pgbench/pgmb_read_delete_no_history.sql: keep_history off.
BARE_QUEUE = "pullq_bare"
BASELINE_TABLE = "bench_pull_baseline"  # the table bench/pgbench/plain_read_delete.sql reads
BATCH = 100  # the qty of bench/pgbench/*_read_delete.sql

#: (label, script, how to fill the queue with %(n)s messages of body %(body)s, how many
#: it holds, how to empty it, the tables to vacuum)
CASES = {
    "plain": (
        f"plain DELETE {BATCH} (SKIP LOCKED)",
        "plain_read_delete.sql",
        f"INSERT INTO {BASELINE_TABLE} (body)"
        " SELECT %(body)s::jsonb FROM generate_series(1, %(n)s)",
        f"SELECT count(*) FROM {BASELINE_TABLE}",
        f"TRUNCATE {BASELINE_TABLE}",
        (BASELINE_TABLE,),
    ),
    "pgmq": (
        f"pgmq.read({BATCH}) + pgmq.delete",
        "pgmq_read_delete.sql",
        "SELECT count(*) FROM pgmq.send_batch('q', ARRAY(SELECT %(body)s::jsonb"
        " FROM generate_series(1, %(n)s)))",
        "SELECT count(*) FROM pgmq.q_q",
        "SELECT pgmq.purge_queue('q')",
        ("pgmq.q_q", "pgmq.a_q"),
    ),
    "pgmq_archive": (
        f"pgmq.read({BATCH}) + pgmq.archive",
        "pgmq_read_archive.sql",
        "SELECT count(*) FROM pgmq.send_batch('q', ARRAY(SELECT %(body)s::jsonb"
        " FROM generate_series(1, %(n)s)))",
        "SELECT count(*) FROM pgmq.q_q",
        "SELECT pgmq.purge_queue('q')",
        ("pgmq.q_q", "pgmq.a_q"),
    ),
    "pgmb": (
        f"pgmb.read({BATCH}) + pgmb.delete, history",
        "pgmb_read_delete.sql",
        "INSERT INTO pgmb_message (routing_key, body)"
        " SELECT 'pull.job', %(body)s::jsonb FROM generate_series(1, %(n)s)",
        f"SELECT count(*) FROM pgmb_delivery d JOIN pgmb_queue q ON q.id = d.queue_id"
        f" WHERE q.name = '{PULL_QUEUE}'",
        # Both queues: each case starts with its own rows alone in pgmb_delivery.
        f"SELECT pgmb.purge('{PULL_QUEUE}') + pgmb.purge('{BARE_QUEUE}')",
        ("pgmb_message", "pgmb_delivery", "pgmb_attempt"),
    ),
    "pgmb_bare": (
        f"pgmb.read({BATCH}) + pgmb.delete, no history",
        "pgmb_read_delete_no_history.sql",
        "INSERT INTO pgmb_message (routing_key, body)"
        " SELECT 'bare.job', %(body)s::jsonb FROM generate_series(1, %(n)s)",
        f"SELECT count(*) FROM pgmb_delivery d JOIN pgmb_queue q ON q.id = d.queue_id"
        f" WHERE q.name = '{BARE_QUEUE}'",
        f"SELECT pgmb.purge('{PULL_QUEUE}') + pgmb.purge('{BARE_QUEUE}')",
        ("pgmb_message", "pgmb_delivery", "pgmb_attempt"),
    ),
}


#: How many times ``--size`` rows the plain table starts each run with.
PLAIN_SIZE_FACTOR = 4

#: The cases of a table, in order; without PGMQ only the plain table's and pgmb's.
KINDS_WITH_PGMQ = ("plain", "pgmb", "pgmb_bare", "pgmq", "pgmq_archive")
KINDS_WITHOUT_PGMQ = ("plain", "pgmb", "pgmb_bare")


class Drained(Exception):
    """A run consumed its whole queue: its rate would count empty reads."""


def set_up() -> None:
    """The pull queues and their plain baseline (a queue table as PGMQ's, without PGMQ)."""
    with harness.connect() as conn:
        conn.execute("SELECT pgmb.create(%s, 'pull.#', 5, NULL)", (PULL_QUEUE,))
        conn.execute("SELECT pgmb.create(%s, 'bare.#', 5, NULL, false)", (BARE_QUEUE,))
        conn.execute(
            f"CREATE TABLE {BASELINE_TABLE} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " vt timestamptz NOT NULL DEFAULT now(), body jsonb NOT NULL)"
        )


def _case(
    kind: str, clients: int, seconds: int, size: int, server: int | None, problems: list[str]
) -> harness.Case:
    label, script, fill, count, empty, tables = CASES[kind]
    # The plain table is consumed several times faster than the queues: it starts with
    # more rows, so that a run never empties it.
    size *= PLAIN_SIZE_FACTOR if kind == "plain" else 1
    body = json.dumps(publish.order_event(1))

    def run() -> harness.Sample:
        with harness.connect() as conn:
            conn.execute(empty)
            conn.execute(fill, {"n": size, "body": body})
            for table in tables:
                conn.execute(f"VACUUM (ANALYZE) {table}")
            cpu_before = harness.tree_cpu(server)
            known = harness.children(server)
            outcome = pgbench_runner.run(script, os.environ["PGMB_BENCH_DB"], clients, seconds, {})
            harness.reaped(server, known)
            cpu_after = harness.tree_cpu(server)
            (left,) = conn.execute(count).fetchone()
        consumed = outcome.transactions * BATCH
        if left == 0 or left < clients * BATCH:
            raise Drained(f"{label}: the queue of {size:,} ran dry; raise --size")
        if left != size - consumed:
            problems.append(
                f"{label}: {left:,} messages left of {size:,}, pgbench consumed {consumed:,}"
            )
        return {
            "rate": outcome.tps * BATCH,
            "server_us": (cpu_after - cpu_before) * 1e6 / max(consumed, 1),
        }

    return harness.Case(f"{label}, {clients} client{'s' if clients > 1 else ''}", run)


def _rows(labels: dict[str, str], goal: float, goal_bare: float) -> list[harness.Row]:
    """pgmb with and without history against PGMQ's read + delete (the goals) and its
    archive; without PGMQ, against the plain table, with no goal."""
    plain, pgmb, bare = labels["plain"], labels["pgmb"], labels["pgmb_bare"]
    if "pgmq" not in labels:
        return [
            harness.Row(plain, plain),
            harness.Row(pgmb, pgmb, "rate", plain),
            harness.Row(bare, bare, "rate", plain),
        ]
    pgmq, archive = labels["pgmq"], labels["pgmq_archive"]
    return [
        harness.Row(plain, plain),
        harness.Row(pgmq, pgmq),
        harness.Row(archive, archive, "rate", pgmq),
        harness.Row(pgmb, pgmb, "rate", pgmq, goal, also=archive),
        harness.Row(bare, bare, "rate", pgmq, goal_bare, also=archive),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2, help="per run (whole seconds, 2)")
    parser.add_argument("--rounds", type=int, default=4, help="runs of each case (default 4)")
    parser.add_argument(
        "--size", type=int, default=200_000, help="messages in the queue at each run's start"
    )
    parser.add_argument(
        "--goal", type=float, default=0.6, help="pgmb with history / PGMQ to reach (0.6)"
    )
    parser.add_argument(
        "--goal-bare", type=float, default=0.8, help="pgmb without history / PGMQ (0.8)"
    )
    parser.add_argument("--db", default="pgmb_bench_pull", help="scratch database to create")
    parser.add_argument("--keep", action="store_true", help="do not drop the database")
    pgmq_sql.add_argument(parser)
    args = parser.parse_args(argv)
    seconds = max(1, round(args.seconds))

    began = time.monotonic()
    problems: list[str] = []
    with harness.scratch_database(args.db, args.keep):
        set_up()
        with_pgmq = args.pgmq_sql is not None
        if with_pgmq and (failure := pgmq_sql.load(args.pgmq_sql)):
            print(f"FAILED: PGMQ from {args.pgmq_sql} did not load: {failure}")
            return 1
        harness.print_machine(
            queues=f"pgmb: pull queues {PULL_QUEUE} (history), {BARE_QUEUE} (no history);"
            f" plain table {BASELINE_TABLE}"
            + ("; PGMQ: queue q (not partitioned, logged)" if with_pgmq else ""),
            pgbench=f"{pgbench_runner.version()}, {pgbench_runner.binary()}",
            pgmq=pgmq_sql.describe(args.pgmq_sql),
            size=f"{args.size:,} messages in the queue at the start of each run",
        )
        server = harness.postmaster()
        load = harness.OtherLoad(server)
        print(
            f"\nmessages/s consumed (read {BATCH} + delete them, one transaction): best of "
            f"{args.rounds} runs of {seconds} s (pgbench -M prepared -T {seconds}); ratios best "
            "against best. Server CPU: all of PostgreSQL's processes, per message (least)."
        )
        try:
            for clients in (4, 1):
                print(f"\n{clients} client{'s' if clients > 1 else ''}:")
                kinds = KINDS_WITH_PGMQ if with_pgmq else KINDS_WITHOUT_PGMQ
                group = tuple(
                    _case(kind, clients, seconds, args.size, server, problems) for kind in kinds
                )
                results = harness.measure([group], args.rounds, load)
                harness.print_table(
                    results,
                    _rows(
                        dict(zip(kinds, (case.label for case in group), strict=True)),
                        args.goal,
                        args.goal_bare,
                    ),
                    harness.best,
                    (harness.Column("server us/msg", "server_us", harness.least),),
                    ratio_title="vs pgmq" if with_pgmq else "vs plain",
                    also_title="vs archive" if with_pgmq else None,
                )
        except (Drained, psycopg.Error, RuntimeError) as exc:
            print(f"\nFAILED: {exc}")
            return 1
    if problems:
        print("\nCOUNT CHECK FAILED:\n  " + "\n  ".join(problems))
        return 1
    print(
        f"\ncount check: every run left exactly what it did not consume; "
        f"{time.monotonic() - began:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
