"""Publishing through SQL, driven by pgbench: pgmb against a plain table and PGMQ.

    scripts/with-cluster.sh .venv/bin/python bench/pgbench_publish.py [--seconds 2] [--rounds 4]
        [--pgmq-sql path/to/pgmq.sql]

In a scratch database with the queues of ``bench/publish.py`` (one bound to ``order.*``,
four that must get nothing) and its plain twin of ``pgmb_message``, PGMQ is loaded from the
SQL file given (``--pgmq-sql`` or ``$PGMQ_SQL``, see bench/pgmq_sql.py) as its SQL-only
install does, with one queue ``q``. Then
pgbench runs the custom scripts of ``bench/pgbench/`` from 4 clients and from 1, one
group of cases at a time, the cases of a group next to each other, their order rotating
between rounds; the best of ``--rounds`` counts:

* one message per transaction: a plain INSERT, ``pgmq.send``, SQL ``pgmb.send`` (no
  dispatcher waits, so no NOTIFY: a busy broker) and the same while a dispatcher waits
  (every commit notifies);
* batches of 100: a plain ``INSERT ... SELECT``, ``pgmq.send_batch`` and pgmb's
  ``INSERT INTO pgmb_message ... SELECT`` (pgmb has no SQL ``send_batch``).

pgmb's goal is 1.0 of PGMQ; the plain table is the physical limit. Without PGMQ the
plain-table baseline runs alone and the output says so; a file given that does not load
is an error. At the end every
pgmb message must have exactly one delivery, in the ``order.*`` queue, and every count
must match what pgbench reported: the exit status is 1 if not, never for a missed ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness, pgbench_runner, pgmq_sql, publish  # noqa: E402

BATCH = 100  # the generate_series of bench/pgbench/*_batch.sql


@dataclass(frozen=True)
class Spec:
    """A pgbench script, what it writes to (a key of the counts) and how many a transaction."""

    label: str
    script: str
    writes: str
    messages: int = 1
    #: A dispatcher registered and marked waiting for the run: every commit notifies.
    waiting: bool = False


#: Each group: the plain table first (the physical limit), then PGMQ, then pgmb's cases.
SINGLES = (
    Spec("plain INSERT (twin table)", "plain_send.sql", "baseline"),
    Spec("pgmq.send()", "pgmq_send.sql", "pgmq"),
    Spec("pgmb.send()", "pgmb_send.sql", "pgmb"),
    # Without a waiting dispatcher pgmb sends no NOTIFY (the case above; decision 0008 in
    # docs/decisions/).
    # With one, each commit notifies and takes the cluster-wide lock: the worst case, since
    # a dispatcher that kept up with this rate would be busy, its mark cleared.
    Spec("pgmb.send(), a dispatcher waiting", "pgmb_send.sql", "pgmb", waiting=True),
)
BATCHES = (
    Spec(f"plain INSERT ... SELECT {BATCH}", "plain_batch.sql", "baseline", BATCH),
    Spec(f"pgmq.send_batch({BATCH})", "pgmq_batch.sql", "pgmq", BATCH),
    Spec(f"pgmb INSERT ... SELECT {BATCH}", "pgmb_batch.sql", "pgmb", BATCH),
)


def _case(
    spec: Spec, clients: int, seconds: int, server: int | None, written: Counter[str]
) -> harness.Case:
    database = os.environ["PGMB_BENCH_DB"]
    variables = {
        "body": json.dumps(publish.order_event(1)),
        "keys": "{" + ",".join(publish.ROUTING_KEYS) + "}",
    }

    def run() -> harness.Sample:
        # WAL is counted cluster-wide and CPU server-wide: exact on `make bench`'s cluster.
        with harness.connect() as conn:
            wal = "SELECT pg_current_wal_insert_lsn() - '0/0'"
            known = harness.children(server)
            with publish.waiting_dispatcher(conn) if spec.waiting else nullcontext():
                wal_before = conn.execute(wal).fetchone()[0]
                cpu_before = harness.tree_cpu(server)
                outcome = pgbench_runner.run(spec.script, database, clients, seconds, variables)
            harness.reaped(server, known)
            wal_after, cpu_after = conn.execute(wal).fetchone()[0], harness.tree_cpu(server)
        messages = max(outcome.transactions * spec.messages, 1)
        written[spec.writes] += outcome.transactions * spec.messages
        return {
            "rate": outcome.tps * spec.messages,
            "server_us": (cpu_after - cpu_before) * 1e6 / messages,
            "wal": float(wal_after - wal_before) / messages,
        }

    return harness.Case(spec.label, run)


def _rows(specs: Sequence[Spec], goal: float) -> list[harness.Row]:
    """pgmb against PGMQ (the goal) and the plain table; PGMQ against the plain table.

    Without PGMQ, pgmb against the plain table alone, with no goal.
    """
    plain, *others = specs
    rows = [harness.Row(plain.label, plain.label)]
    rival = next((spec.label for spec in others if spec.writes == "pgmq"), None)
    for spec in others:
        if rival is None:
            rows.append(harness.Row(spec.label, spec.label, baseline=plain.label))
        elif spec.label == rival:
            rows.append(harness.Row(spec.label, spec.label, also=plain.label))
        else:
            rows.append(harness.Row(spec.label, spec.label, "rate", rival, goal, plain.label))
    return rows


def verify(order_queue: str, written: Counter[str], pgmq: bool) -> list[str]:
    """bench/publish.py's routing check, and PGMQ's queue holding what pgbench counted."""
    problems = publish.verify(order_queue, written)
    if pgmq:
        with harness.connect() as conn:
            (stored,) = conn.execute(f"SELECT count(*) FROM pgmq.q_{pgmq_sql.QUEUE}").fetchone()
        if stored != written["pgmq"]:
            problems.append(
                f"{stored:,} PGMQ messages stored, pgbench reported {written['pgmq']:,}"
            )
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=2, help="per run, whole seconds for pgbench (default 2)"
    )
    parser.add_argument("--rounds", type=int, default=4, help="runs of each case (default 4)")
    parser.add_argument("--goal", type=float, default=1.0, help="pgmb / PGMQ to reach (1.0)")
    parser.add_argument("--db", default="pgmb_bench_pgbench", help="scratch database to create")
    parser.add_argument("--keep", action="store_true", help="do not drop the database")
    pgmq_sql.add_argument(parser)
    args = parser.parse_args(argv)
    # pgbench's -T counts whole seconds.
    seconds = max(1, round(args.seconds))

    began = time.monotonic()
    with harness.scratch_database(args.db, args.keep):
        order_queue = publish.set_up(0)
        with_pgmq = args.pgmq_sql is not None
        if with_pgmq and (failure := pgmq_sql.load(args.pgmq_sql)):
            print(f"FAILED: PGMQ from {args.pgmq_sql} did not load: {failure}")
            return 1
        harness.print_machine(
            queues=f"{1 + len(publish.OTHER_BINDINGS)}, one of them "
            f"({publish.MATCHING_BINDING}) matching every message",
            pgbench=f"{pgbench_runner.version()}, {pgbench_runner.binary()}",
            pgmq=pgmq_sql.describe(args.pgmq_sql),
        )
        server = harness.postmaster()
        load = harness.OtherLoad(server)
        written: Counter[str] = Counter()
        print(
            f"\nmessages/s: best of {args.rounds} runs of {seconds} s (pgbench -M prepared -T "
            f"{seconds}, -c and -j = clients), the cases of a table next to each other; ratios "
            "best against best. Server CPU: all of PostgreSQL's processes, per message (least "
            "of the runs). WAL: bytes per message (median)."
        )
        for specs, what in ((SINGLES, "one message per transaction"), (BATCHES, "batches")):
            if not with_pgmq:
                specs = tuple(spec for spec in specs if spec.writes != "pgmq")
            for clients in (4, 1):
                print(f"\n{what.capitalize()}, {clients} client{'s' if clients > 1 else ''}:")
                group = tuple(_case(s, clients, seconds, server, written) for s in specs)
                results = harness.measure([group], args.rounds, load)
                harness.print_table(
                    results,
                    _rows(specs, args.goal),
                    harness.best,
                    (
                        harness.Column("server us/msg", "server_us", harness.least),
                        harness.Column("WAL B/msg", "wal", harness.median),
                    ),
                    ratio_title="vs pgmq" if with_pgmq else "vs plain",
                    also_title="vs plain" if with_pgmq else None,
                )
        problems = verify(order_queue, written, with_pgmq)
    if problems:
        print("\nROUTING CHECK FAILED:\n  " + "\n  ".join(problems))
        return 1
    print(
        f"\nrouting check: {written['pgmb']:,} pgmb messages, each delivered once to "
        f"{publish.MATCHING_BINDING} and to no other queue; "
        + (f"{written['pgmq']:,} PGMQ messages; " if with_pgmq else "")
        + f"{written['baseline']:,} plain rows; {time.monotonic() - began:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
