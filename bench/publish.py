"""Publishing throughput: pgmb's publish path against plain INSERTs into a twin table.

    scripts/with-cluster.sh .venv/bin/python bench/publish.py [--seconds 1.5] [--rounds 4]

In a scratch database: one queue bound to ``order.*``, four that must get nothing, and a
baseline table shaped like ``pgmb_message`` with no trigger, no CHECK and no deliveries,
written with the statements of ``pgmb/sql/queries/publish.sql`` (only the table name changed)
through the same Django connection, so a ratio isolates what routing costs. Each case
publishes for ``--seconds`` from 1 or 4 client processes calling ``pgmb.send`` /
``pgmb.send_batch``, next to a run of its baseline; the best of ``--rounds`` counts. At
the end every message must have exactly one delivery, in the ``order.*`` queue.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

ROUTING_KEYS = ("order.created", "order.paid", "order.shipped")
MATCHING_BINDING = "order.*"
#: Queues that must get nothing: they make the routing join do real work.
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
    available_at timestamptz NOT NULL DEFAULT now(),
    priority smallint NOT NULL DEFAULT 0,
    group_key varchar(128),
    depends_on uuid[],
    dedup_id varchar(128),
    max_retries integer,
    retry_delay float8,
    expires_at timestamptz
)
"""


def order_event(n: int) -> dict[str, Any]:
    """A plausible order event (~120 bytes of JSON)."""
    return {
        "order_id": n,
        "customer": f"c-{n % 9973:05d}",
        "total": "129.90",
        "currency": "EUR",
        "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}],
    }


# --- What a client does, once per call; each returns how many messages it published. ---


def _send(n: int) -> int:
    import pgmb

    pgmb.send(ROUTING_KEYS[n % 3], order_event(n))
    return 1


def _send_batch(n: int) -> int:
    import pgmb

    pgmb.send_batch([(ROUTING_KEYS[i % 3], order_event(n + i)) for i in range(BATCH)])
    return BATCH


def _sql_send(n: int) -> int:
    """The SQL function, as a producer that is not Django would call it."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pgmb.send(%s, %s, %s::jsonb)",
            (uuid.uuid4(), ROUTING_KEYS[n % 3], json.dumps(order_event(n))),
        )
    return 1


def _baseline_sql(name: str) -> str:
    from pgmb import sql

    return sql.query("publish.sql", name).replace("pgmb_message", BASELINE_TABLE)


def _insert(n: int) -> int:
    from django.db import connection

    # The parameters pgmb.send passes: id, key, body, headers, no absolute time, no delay,
    # no message options, no expiry.
    params = (uuid.uuid4(), ROUTING_KEYS[n % 3], json.dumps(order_event(n)), "{}", None, None)
    params += (0, None, None, None, None, None, None, None)
    with connection.cursor() as cursor:
        cursor.execute(_baseline_sql("send"), params)
    return 1


def _insert_batch(n: int) -> int:
    from django.db import connection

    columns = (
        [uuid.uuid4() for _ in range(BATCH)],
        [ROUTING_KEYS[i % 3] for i in range(BATCH)],
        [json.dumps(order_event(n + i)) for i in range(BATCH)],
        ["{}"] * BATCH,
        [None] * BATCH,
        [None] * BATCH,
        [0] * BATCH,
        *([None] * BATCH for _ in range(7)),
    )
    with connection.cursor() as cursor:
        cursor.execute(_baseline_sql("send_batch"), columns)
    return BATCH


OPS: dict[str, Callable[[int], int]] = {
    "send": _send,
    "send_batch": _send_batch,
    "sql_send": _sql_send,
    "insert": _insert,
    "insert_batch": _insert_batch,
}

# (label, operation, clients, a dispatcher waiting); each case after its baseline. With no
# dispatcher waiting pgmb sends no NOTIFY (decision 0008 in docs/decisions/); with one, every
# publishing transaction does (the worst case: a dispatcher that kept up would be busy instead).
BASELINE_1 = ("baseline: INSERT 1 row", "insert", 1, False)
BASELINE_4 = ("baseline: INSERT 1 row", "insert", 4, False)
BASELINE_BATCH = (f"baseline: INSERT {BATCH} rows (unnest)", "insert_batch", 1, False)
WAITING = "a dispatcher waiting"
PAIRS = (
    (BASELINE_1, ("pgmb.send", "send", 1, False)),
    (BASELINE_1, (f"pgmb.send, {WAITING}", "send", 1, True)),
    (BASELINE_1, ("SQL pgmb.send()", "sql_send", 1, False)),
    (BASELINE_4, ("pgmb.send", "send", 4, False)),
    (BASELINE_4, (f"pgmb.send, {WAITING}", "send", 4, True)),
    (BASELINE_BATCH, (f"pgmb.send_batch({BATCH})", "send_batch", 1, False)),
    (BASELINE_BATCH, (f"pgmb.send_batch({BATCH}), {WAITING}", "send_batch", 1, True)),
)


@contextmanager
def waiting_dispatcher(conn: Any) -> Iterator[None]:
    """A dispatcher registered and marked waiting, as pgmb_dispatch is when idle: every
    publishing transaction notifies meanwhile."""
    (dispatcher,) = conn.execute(
        "SELECT pgmb.dispatcher_start('external', 'bench', pg_backend_pid())"
    ).fetchone()
    conn.execute("SELECT pgmb.dispatcher_idle(%s)", (dispatcher,))
    try:
        yield
    finally:
        conn.execute("SELECT pgmb.dispatcher_stop(%s, 0, 0)", (dispatcher,))


def _client(op: str, start_at: float, seconds: float) -> tuple[int, float, float, float]:
    """In a client process: ``op`` in a loop; (messages, end, server CPU s, client CPU s)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone()
    # Start together and stop on the wall clock: the rate is what the server sustains with
    # this many producers busy, not how fast one of them starts.
    time.sleep(max(0.0, start_at - time.time()))
    server, client = harness.backend_cpu(backend), time.process_time()
    count, seq = 0, uuid.uuid4().int % 10**12
    while time.time() < start_at + seconds:
        count += OPS[op](seq + count)
    end = time.time()
    return count, end, harness.backend_cpu(backend) - server, time.process_time() - client


def _case(
    spec: tuple[str, str, int, bool], pool: harness.Pool, seconds: float, written: Counter[str]
) -> harness.Case:
    label, op, clients, waiting = spec
    label = f"{label}, {clients} client{'s' if clients > 1 else ''}"

    def run() -> harness.Sample:
        # WAL is counted cluster-wide: exact on the throwaway cluster of `make bench`.
        with harness.connect() as conn:
            wal = "SELECT pg_current_wal_insert_lsn() - '0/0'"
            with waiting_dispatcher(conn) if waiting else nullcontext():
                before = conn.execute(wal).fetchone()[0]
                start_at = time.time() + 0.2
                answers = pool.map(_client, [(op, start_at, seconds)] * clients)
                after = conn.execute(wal).fetchone()[0]
        total = sum(a[0] for a in answers)
        written["baseline" if op.startswith("insert") else "pgmb"] += total
        per_message = 1e6 / max(total, 1)
        return {
            "rate": total / (max(a[1] for a in answers) - start_at),
            "server_us": sum(a[2] for a in answers) * per_message,
            "client_us": sum(a[3] for a in answers) * per_message,
            "wal": float(after - before) / max(total, 1),
        }

    return harness.Case(label, run)


def set_up(extra_queues: int) -> str:
    """The worker, the queues and the baseline table; the id of the matching queue."""
    from django.db import connection

    from pgmb.models import Queue, Worker

    worker = Worker.objects.create(name="bench", endpoint="http://127.0.0.1:9/", rps=1000)
    order = Queue.objects.create(name="order_queue", binding_key=MATCHING_BINDING, worker=worker)
    for name, binding in OTHER_BINDINGS.items():
        Queue.objects.create(name=name, binding_key=binding, worker=worker)
    # Each with a first word of its own, as many services' queues would have.
    for n in range(extra_queues):
        Queue.objects.create(name=f"extra_{n}", binding_key=f"svc{n}.*.#", worker=worker)
    with connection.cursor() as cursor:
        cursor.execute(BASELINE_DDL)
    return str(order.id)


def verify(order_queue: str, written: Counter[str]) -> list[str]:
    """What is wrong with the routing of everything published (empty when all is well)."""
    with harness.connect() as conn:
        (messages,) = conn.execute("SELECT count(*) FROM pgmb_message").fetchone()
        (baseline,) = conn.execute(f"SELECT count(*) FROM {BASELINE_TABLE}").fetchone()
        (not_once,) = conn.execute(
            "SELECT count(*) FILTER (WHERE n <> 1) FROM (SELECT m.id, count(d.id) AS n"
            " FROM pgmb_message m LEFT JOIN pgmb_delivery d"
            " ON d.message_id = m.id AND d.queue_id = %s GROUP BY m.id) AS per_message",
            (order_queue,),
        ).fetchone()
        strays = conn.execute(
            "SELECT q.name, count(*) FROM pgmb_delivery d JOIN pgmb_queue q ON q.id = d.queue_id"
            " WHERE d.queue_id <> %s GROUP BY q.name",
            (order_queue,),
        ).fetchall()
    problems = [
        f"{count:,} deliveries in queue {name}, which must match nothing" for name, count in strays
    ]
    if messages != written["pgmb"]:
        problems.append(f"{messages:,} messages stored, clients reported {written['pgmb']:,}")
    if baseline != written["baseline"]:
        problems.append(f"{baseline:,} baseline rows, clients reported {written['baseline']:,}")
    if not_once:
        problems.append(f"{not_once:,} messages without exactly one delivery in {MATCHING_BINDING}")
    if not messages:
        problems.append("nothing was published")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="per run (default 1.5)")
    parser.add_argument("--rounds", type=int, default=4, help="runs of each case (default 4)")
    parser.add_argument("--goal", type=float, default=0.8, help="ratio to reach (default 0.8)")
    parser.add_argument("--db", default="pgmb_bench", help="scratch database to create")
    parser.add_argument("--keep", action="store_true", help="do not drop the database")
    parser.add_argument(
        "--extra-queues", type=int, default=0, help="more queues that match nothing (default 0)"
    )
    args = parser.parse_args(argv)

    began = time.monotonic()
    with harness.scratch_database(args.db, args.keep):
        order_queue = set_up(args.extra_queues)
        harness.print_machine(
            queues=f"{1 + len(OTHER_BINDINGS) + args.extra_queues}, "
            f"one of them ({MATCHING_BINDING}) matching every message"
        )
        load = harness.OtherLoad(harness.postmaster())
        written: Counter[str] = Counter()
        with harness.Pool(4) as pool:
            pairs = [
                (_case(base, pool, args.seconds, written), _case(spec, pool, args.seconds, written))
                for base, spec in PAIRS
            ]
            results = harness.measure(pairs, args.rounds, load)
        print(
            f"\nmessages/s: best of {args.rounds} runs of {args.seconds:g} s, each next to a run "
            "of its baseline; ratio = best against best. CPU per message (least of the runs): "
            "the server backends', the clients'. WAL: bytes per message (median)."
        )
        rows: list[harness.Row] = []
        for base, case in pairs:
            if all(row.case != base.label for row in rows):
                rows.append(harness.Row(base.label, base.label))
            rows.append(harness.Row(case.label, case.label, baseline=base.label, goal=args.goal))
        harness.print_table(
            results,
            rows,
            harness.best,
            (
                harness.Column("server us/msg", "server_us", harness.least),
                harness.Column("client us/msg", "client_us", harness.least),
                harness.Column("WAL B/msg", "wal", harness.median),
            ),
        )
        problems = verify(order_queue, written)
    if problems:
        print("\nROUTING CHECK FAILED:\n  " + "\n  ".join(problems))
        return 1
    print(
        f"\nrouting check: {written['pgmb']:,} messages, each delivered once to "
        f"{MATCHING_BINDING} and to no other queue; {written['baseline']:,} baseline rows; "
        f"{time.monotonic() - began:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
