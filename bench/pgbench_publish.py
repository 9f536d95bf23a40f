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
    #: pgbench variables of this case beyond the body and the keys.
    variables: tuple[tuple[str, str], ...] = ()


#: Each group: the plain table first (the physical limit), then PGMQ, then pgmb's cases.
SINGLES = (
    Spec("plain INSERT (twin table)", "plain_send.sql", "baseline"),
    Spec("pgmq.send()", "pgmq_send.sql", "pgmq"),
    Spec("pgmb.send()", "pgmb_send.sql", "pgmb"),
    # Unique while live (docs/decisions/0090-unique-while-live.md): a key nothing holds.
    Spec("pgmb.send_unique(), a new key", "pgmb_send_unique.sql", "pgmb"),
    # Without a waiting dispatcher pgmb sends no NOTIFY (the case above; decision 0008 in
    # docs/decisions/).
    # With one, each commit notifies and takes the cluster-wide lock: the worst case, since
    # a dispatcher that kept up with this rate would be busy, its mark cleared.
    Spec("pgmb.send(), a dispatcher waiting", "pgmb_send.sql", "pgmb", waiting=True),
)
BATCHES = (
    Spec(f"plain INSERT ... SELECT {BATCH}", "plain_batch.sql", "baseline", BATCH),
    Spec(f"pgmq.send_batch({BATCH})", "pgmq_batch.sql", "pgmq", BATCH),
    # pgmb's own limit: its message and delivery rows written by one plain statement into
    # copies of its tables (same indexes, no triggers); pgmb's goal against it is LIMIT_GOAL.
    Spec(f"limit: rows of {BATCH} routed, one statement", "limit_batch.sql", "limit", BATCH),
    Spec(f"pgmb INSERT ... SELECT {BATCH}", "pgmb_batch.sql", "pgmb", BATCH),
)
#: pgmb's batch against its design limit (the "limit" case).
LIMIT_GOAL = 0.8
#: One message for k queues: PGMQ sends it to each of k queues (one statement, k calls of
#: pgmq.send), pgmb stores it once and routes it to the k queues bound to its key.
FANOUTS = (2, 4)
FANOUT_KEY = "fanout{k}.sent"


def fanout_specs(k: int) -> tuple[Spec, ...]:
    return (
        Spec("plain INSERT (twin table)", "plain_send.sql", "baseline"),
        Spec(
            f"pgmq.send() to {k} queues, one transaction",
            "pgmq_send_fanout.sql",
            f"pgmq_fanout{k}",
            variables=(("k", str(k)),),
        ),
        Spec(
            f"pgmb.send() routed to {k} queues",
            "pgmb_send_fanout.sql",
            f"pgmb_fanout{k}",
            variables=(("k", str(k)), ("fankey", FANOUT_KEY.format(k=k))),
        ),
    )


def _case(
    spec: Spec, clients: int, seconds: int, server: int | None, written: Counter[str]
) -> harness.Case:
    database = os.environ["PGMB_BENCH_DB"]
    variables = {
        "body": json.dumps(publish.order_event(1)),
        "keys": "{" + ",".join(publish.ROUTING_KEYS) + "}",
        "queue": os.environ["PGMB_BENCH_ORDER_QUEUE"],
        **dict(spec.variables),
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

    Without PGMQ, pgmb against the plain table alone, with no goal. In a group with pgmb's
    design limit, pgmb is held against it (LIMIT_GOAL) on a row of its own.
    """
    plain, *others = specs
    rows = [harness.Row(plain.label, plain.label)]
    rival = next((s.label for s in others if s.writes.startswith("pgmq")), None)
    limit = next((s.label for s in others if s.writes == "limit"), None)
    for spec in others:
        if rival is None:
            rows.append(harness.Row(spec.label, spec.label, baseline=plain.label))
        elif spec.label in (rival, limit):
            rows.append(harness.Row(spec.label, spec.label, also=plain.label))
        else:
            rows.append(harness.Row(spec.label, spec.label, "rate", rival, goal, plain.label))
    if limit is not None:
        pgmb = specs[-1].label
        rows.append(harness.Row(f"{pgmb}, of its limit", pgmb, "rate", limit, LIMIT_GOAL))
    return rows


def set_up_limit_and_fanout(with_pgmq: bool) -> None:
    """The copies of pgmb's tables for the design limit; the queues of the fan-out cases."""
    from pgmb.models import Queue, Worker

    worker = Worker.objects.get(name="bench")
    for k in FANOUTS:
        for n in range(1, k + 1):
            Queue.objects.create(
                name=f"fanout{k}_{n}", binding_key=FANOUT_KEY.format(k=k), worker=worker
            )
    with harness.connect() as conn:
        conn.execute("CREATE TABLE bench_limit_message (LIKE pgmb_message INCLUDING ALL)")
        conn.execute("CREATE TABLE bench_limit_delivery (LIKE pgmb_delivery INCLUDING ALL)")
        if with_pgmq:
            for n in range(1, max(FANOUTS) + 1):
                conn.execute("SELECT pgmq.create(%s)", (f"f{n}",))


def settle_queue_statistics(since: object, at_most: float = 90) -> str:
    """Wait, as a running install would have, for autovacuum to analyze pgmb_queue if its
    settings say it will (the routing trigger's plan follows them): with PostgreSQL's
    defaults, after 50 changed rows, which a few queues never reach, so nothing to wait for.
    The queues' rows stand for the changes (the counts of the statistics lag behind);
    ``since``: the server's time before the queues were created."""
    due = (
        "SELECT (SELECT count(*) FROM pgmb_queue) > coalesce(("
        "   SELECT o.option_value::float8 FROM pg_options_to_table(c.reloptions) AS o"
        "   WHERE o.option_name = 'autovacuum_analyze_threshold'),"
        "   current_setting('autovacuum_analyze_threshold')::float8)"
        " + coalesce(("
        "   SELECT o.option_value::float8 FROM pg_options_to_table(c.reloptions) AS o"
        "   WHERE o.option_name = 'autovacuum_analyze_scale_factor'),"
        "   current_setting('autovacuum_analyze_scale_factor')::float8) * greatest(c.reltuples, 0)"
        " FROM pg_class c WHERE c.oid = 'pgmb_queue'::regclass"
    )
    analyzed = (
        "SELECT coalesce(greatest(last_analyze, last_autoanalyze) > %s, false)"
        " FROM pg_stat_user_tables WHERE relid = 'pgmb_queue'::regclass"
    )
    began = time.monotonic()
    with harness.connect() as conn:
        if not conn.execute(due).fetchone()[0]:
            return "not due for autovacuum's analyze"
        while time.monotonic() - began < at_most:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            if conn.execute(analyzed, (since,)).fetchone()[0]:
                return f"analyzed by autovacuum within {time.monotonic() - began:.0f} s"
            time.sleep(1)
    return f"not analyzed by autovacuum within {at_most:.0f} s"


def verify_fanout(written: Counter[str], pgmq: bool) -> list[str]:
    """Each fan-out message delivered once to each queue of its key and to no other; PGMQ's
    queues holding what pgbench counted."""
    problems = []
    with harness.connect() as conn:
        for k in FANOUTS:
            key = FANOUT_KEY.format(k=k)
            (messages, wrong) = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE n <> %s OR stray > 0) FROM ("
                " SELECT m.id, count(d.id) FILTER (WHERE q.binding_key = m.routing_key) AS n,"
                " count(d.id) FILTER (WHERE q.binding_key <> m.routing_key) AS stray"
                " FROM pgmb_message m LEFT JOIN pgmb_delivery d ON d.message_id = m.id"
                " LEFT JOIN pgmb_queue q ON q.id = d.queue_id"
                " WHERE m.routing_key = %s GROUP BY m.id) AS per_message",
                (k, key),
            ).fetchone()
            reported = written[f"pgmb_fanout{k}"]
            if messages != reported:
                problems.append(f"{messages:,} messages of {key}, pgbench reported {reported:,}")
            if wrong:
                problems.append(
                    f"{wrong:,} messages of {key} not delivered once to each of {k} queues"
                )
        if pgmq:
            for n in range(1, max(FANOUTS) + 1):
                (stored,) = conn.execute(f"SELECT count(*) FROM pgmq.q_f{n}").fetchone()
                expected = sum(written[f"pgmq_fanout{k}"] for k in FANOUTS if k >= n)
                if stored != expected:
                    problems.append(
                        f"{stored:,} PGMQ messages in f{n}, pgbench reported {expected:,}"
                    )
    return problems


def verify(order_queue: str, written: Counter[str], pgmq: bool) -> list[str]:
    """bench/publish.py's routing check, and PGMQ's queue holding what pgbench counted."""
    problems = publish.verify(order_queue, written)
    with harness.connect() as conn:
        (limit,) = conn.execute("SELECT count(*) FROM bench_limit_delivery").fetchone()
    if limit != written["limit"]:
        problems.append(f"{limit:,} design-limit rows, pgbench reported {written['limit']:,}")
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
        with harness.connect() as conn:
            (set_up_at,) = conn.execute("SELECT now()").fetchone()
        order_queue = publish.set_up(0)
        os.environ["PGMB_BENCH_ORDER_QUEUE"] = order_queue
        with_pgmq = args.pgmq_sql is not None
        if with_pgmq and (failure := pgmq_sql.load(args.pgmq_sql)):
            print(f"FAILED: PGMQ from {args.pgmq_sql} did not load: {failure}")
            return 1
        set_up_limit_and_fanout(with_pgmq)
        statistics = settle_queue_statistics(set_up_at)
        harness.print_machine(
            queues=f"{1 + len(publish.OTHER_BINDINGS)}, one of them "
            f"({publish.MATCHING_BINDING}) matching every message; pgmb_queue {statistics}",
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
        groups = [(SINGLES, "one message per transaction"), (BATCHES, "batches")]
        groups += [(fanout_specs(k), f"one message for {k} queues") for k in FANOUTS]
        problems: list[str] = []
        for specs, what in groups:
            if specs is groups[2][0]:
                # The routing check of the cases above, before fan-out adds other queues' rows.
                problems = verify(order_queue, written, with_pgmq)
            if not with_pgmq:
                specs = tuple(spec for spec in specs if not spec.writes.startswith("pgmq"))
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
        problems += verify_fanout(written, with_pgmq)
    if problems:
        print("\nROUTING CHECK FAILED:\n  " + "\n  ".join(problems))
        return 1
    print(
        f"\nrouting check: {written['pgmb']:,} pgmb messages, each delivered once to "
        f"{publish.MATCHING_BINDING} and to no other queue; "
        + (f"{written['pgmq']:,} PGMQ messages; " if with_pgmq else "")
        + ", ".join(
            f"{written[f'pgmb_fanout{k}']:,} pgmb messages each to {k} queues" for k in FANOUTS
        )
        + "; "
        + f"{written['baseline']:,} plain rows; {time.monotonic() - began:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
