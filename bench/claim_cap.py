"""What a cap on requests in flight costs a claim: backend CPU per claim of one row, for an
uncapped and a capped worker, this tree's pgmb.claim against a baseline's.

    scripts/with-cluster.sh .venv/bin/python bench/claim_cap.py [--baseline main] [--rounds 4]

In a scratch database: two workers, one capped (so high that it never binds: what is
measured is the count, not a refusal), each with a queue of ready deliveries, and
``--in-flight`` unexpired leases of each worker plus as many of a third (what running
dispatchers hold; the count reads them all through pgmb_delivery_leased). The baseline's
pgmb.claim (``git show BASELINE:pgmb/sql/schema/deliveries.sql``) is installed beside this
tree's as pgmb.claim_baseline. Each sample is ``--calls`` claims of one row, each in a
transaction rolled back (the tables stay as they are), on one connection whose backend's
CPU is read from /proc (warmed first: the plans are cached). Baseline and tree alternate
(ABBA), ``--rounds`` times.
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


def baseline_claim(rev: str) -> str:
    """The baseline's pgmb.claim, renamed pgmb.claim_baseline."""
    text = subprocess.run(
        ["git", "show", f"{rev}:pgmb/sql/schema/deliveries.sql"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    start = text.index("CREATE OR REPLACE FUNCTION pgmb.claim(")
    end = text.index("END $$;", start) + len("END $$;")
    return text[start:end].replace("pgmb.claim(", "pgmb.claim_baseline(", 1)


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


def sample(conn, function: str, queue: str, calls: int) -> float:
    """Backend CPU microseconds per claim of one row."""
    pid = conn.info.backend_pid
    statement = f"SELECT count(*) FROM pgmb.{function}(ARRAY['{queue}'], 1)"
    before = harness.backend_cpu(pid)
    for _ in range(calls):
        with conn.transaction(force_rollback=True):
            (got,) = conn.execute(statement).fetchone()
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
            conn.execute(baseline_claim(args.baseline))
            figures: dict[tuple[str, str], list[float]] = {}
            for queue in ("free", "capped"):
                for function in ("claim_baseline", "claim"):
                    sample(conn, function, queue, 50)  # warm: plans cached
            for round_ in range(args.rounds):
                for queue in ("free", "capped"):
                    order = ("claim_baseline", "claim")
                    if round_ % 2:
                        order = order[::-1]
                    for function in order:
                        figures.setdefault((queue, function), []).append(
                            sample(conn, function, queue, args.calls)
                        )
        harness.print_machine(baseline=args.baseline)
    print(f"backend CPU per claim of one row, µs ({args.rounds} rounds of {args.calls} calls,")
    print(f"{args.in_flight} leases in flight per worker, 3 workers)")
    print(f"  {'worker':<8} {'baseline':>18} {'this tree':>18} {'ratio (median)':>15}")
    for queue in ("free", "capped"):
        base, tree = figures[(queue, "claim_baseline")], figures[(queue, "claim")]
        print(
            f"  {queue:<8} {min(base):>8.0f}-{max(base):<8.0f} {min(tree):>8.0f}-{max(tree):<8.0f}"
            f" {statistics.median(tree) / statistics.median(base):>15.2f}"
        )


if __name__ == "__main__":
    main()
