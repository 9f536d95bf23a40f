"""What a cap on requests in flight costs a claim and an ack: backend CPU per claim of one
row (and per claim and ack of it), for an uncapped and a capped worker, this tree's
pgmb.claim and pgmb.ack against a baseline's.

    scripts/with-cluster.sh .venv/bin/python bench/claim_cap.py [--baseline main] [--rounds 4]

In a scratch database: two workers, one capped (so high that it never binds: what is
measured is the count, not a refusal), each with a queue of ready deliveries, and
``--in-flight`` unexpired leases of each worker plus as many of a third (what running
dispatchers hold; the count reads them all through pgmb_delivery_leased). The baseline's
pgmb.claim and pgmb.ack (``git show BASELINE:pgmb/sql/schema/deliveries.sql``) are
installed beside this tree's as pgmb.claim_baseline and pgmb.ack_baseline. Each sample is
``--calls`` claims of one row (acked or not), each in a transaction rolled back (the
tables stay as they are), on one connection whose backend's CPU is read from /proc
(warmed first: the plans are cached). Baseline and tree alternate (ABBA), ``--rounds``
times.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

SETUP = """
SELECT pgmb.worker(name, 'http://127.0.0.1:9/', 100000)
FROM unnest(ARRAY['free', 'capped', 'other']) AS name;
UPDATE pgmb_worker SET max_in_flight = 1000000 WHERE name = 'capped';
SELECT pgmb.create(w.name, w.name || '.#', 5, w.id) FROM pgmb_worker w;
UPDATE pgmb_queue SET lease_seconds = 3600;
"""


def baseline_functions(rev: str) -> str:
    """The baseline's pgmb.claim and pgmb.ack, renamed pgmb.claim_baseline and
    pgmb.ack_baseline."""
    text = subprocess.run(
        ["git", "show", f"{rev}:pgmb/sql/schema/deliveries.sql"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    functions = []
    for name in ("claim", "ack"):
        start = text.index(f"CREATE OR REPLACE FUNCTION pgmb.{name}(")
        end = text.index("END $$;", start) + len("END $$;")
        functions.append(text[start:end].replace(f"pgmb.{name}(", f"pgmb.{name}_baseline(", 1))
    return ";\n".join(functions)


def fill(conn, ready: int, in_flight: int) -> None:
    conn.execute(SETUP)
    for name in ("free", "capped", "other"):
        conn.execute(
            "INSERT INTO pgmb_message (id, routing_key, body)"
            " SELECT pgmb.uuid_v7(), %s, '{}' FROM generate_series(1, %s)",
            (f"{name}.x", ready + in_flight),
        )
        # Leased, unexpired: requests in flight.
        conn.execute("SELECT count(*) FROM pgmb.claim(ARRAY[%s], %s)", (name, in_flight))
    conn.execute("VACUUM ANALYZE pgmb_delivery")


#: What is measured: (worker, whether the claimed row is acked too).
CASES = (("free", False), ("capped", False), ("free", True), ("capped", True))


def sample(conn, suffix: str, case: tuple[str, bool], calls: int) -> float:
    """Backend CPU microseconds per claim of one row (and its ack)."""
    queue, acked = case
    pid = conn.info.backend_pid
    claim = f"SELECT delivery_id FROM pgmb.claim{suffix}(ARRAY['{queue}'], 1)"
    ack = f"SELECT pgmb.ack{suffix}(ARRAY[%s]::bigint[], ARRAY[200], ARRAY[1.0::float8])"
    before = harness.backend_cpu(pid)
    for _ in range(calls):
        with conn.transaction(force_rollback=True):
            [(delivery_id,)] = conn.execute(claim).fetchall()
            if acked:
                (got,) = conn.execute(ack, (delivery_id,)).fetchone()
                assert got == 1, got
    return (harness.backend_cpu(pid) - before) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="main")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--ready", type=int, default=5000)
    parser.add_argument("--in-flight", type=int, default=100)
    args = parser.parse_args()
    with harness.scratch_database("pgmb_bench_claim_cap"):
        with harness.connect() as conn:
            fill(conn, args.ready, args.in_flight)
            conn.execute(baseline_functions(args.baseline))
            figures: dict[tuple[tuple[str, bool], str], list[float]] = {}
            for case in CASES:
                for suffix in ("_baseline", ""):
                    sample(conn, suffix, case, 50)  # warm: plans cached
            for round_ in range(args.rounds):
                for case in CASES:
                    order = ("_baseline", "") if round_ % 2 == 0 else ("", "_baseline")
                    for suffix in order:
                        figures.setdefault((case, suffix), []).append(
                            sample(conn, suffix, case, args.calls)
                        )
        harness.print_machine(baseline=args.baseline)
    print(f"backend CPU per call, µs ({args.rounds} rounds of {args.calls} calls, each rolled")
    print(f"back; {args.in_flight} leases in flight per worker, 3 workers)")
    print(f"  {'what':<24} {'baseline':>17} {'this tree':>17} {'ratio (median)':>15}")
    for case in CASES:
        base, tree = figures[(case, "_baseline")], figures[(case, "")]
        what = f"claim 1{' + ack' if case[1] else ''}, {case[0]}"
        print(
            f"  {what:<24} {min(base):>8.0f}-{max(base):<8.0f} {min(tree):>8.0f}-{max(tree):<8.0f}"
            f" {statistics.median(tree) / statistics.median(base):>15.2f}"
        )


if __name__ == "__main__":
    main()
