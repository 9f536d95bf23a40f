"""The archive job on whole days against row by row, on the same history.

    scripts/with-cluster.sh .venv/bin/python bench/archive_days.py [--days 3] [--rounds 2]

In a scratch database: ``--days`` UTC days of history (3 to 3 + days - 1 days ago), each
of ``--per-day`` finished messages (routed to no queue) with one ack attempt, and
``--kept`` of them per day with a live delivery. The same rows, inserted through
``pgmb_message`` by the same statements, land in the days' partitions (**days**: the
partitions made first) or in the default partitions (**rows**: no partition of those
days). Then ``python -m pgmb.pipeline archive --older-than 1`` end to end, as a user runs
it; its report's lines are timed as they come, which splits the run into phases: start
(process, JVM, Spark session, the first query), claim (days detached, rows claimed), write
(Spark reads and writes the Parquet, the counts read back), retire (days dropped, rows
deleted) and the rest; and, from the report, the longest a day's claim held the history's
locks (publishes, claims and settles wait meanwhile). After each run, only the kept
messages and their attempts may be left. The two variants alternate (ABBA), ``--rounds``
times.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

MASTER = "local[2]"
#: The report's lines that end each phase, in order.
PHASES = (
    ("start", ": messages finished before"),
    ("claim", ": writing "),
    ("write", ": committed "),
    ("retire", "archived "),
)

#: Each variant's last report (True: days).
REPORTS: dict[bool, str] = {}

FILL = """
INSERT INTO pgmb_message (id, routing_key, body, created_at, available_at)
SELECT (lpad(to_hex(ms), 12, '0') || '7' || substr(md5(g::text || random()::text), 1, 19))::uuid,
       'bench.archive', jsonb_build_object('order_id', g, 'total', '129.90', 'currency', 'EUR'),
       to_timestamp(ms / 1000.0), to_timestamp(ms / 1000.0)
FROM generate_series(1, %(n)s) AS g,
     LATERAL (SELECT (extract(epoch FROM %(day)s::date::timestamp) * 1000)::bigint + g * 400
              AS ms) AS t
"""

ATTEMPTS = """
INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms,
                          error, created_at)
SELECT m.id, %(queue)s, 1, 'ack', 200, 1.5, '', m.created_at FROM pgmb_message m
"""

KEPT = """
INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at, created_at)
SELECT m.id, %(queue)s, 'ready', 0, now(), now()
FROM (SELECT id, row_number() OVER (PARTITION BY created_at::date ORDER BY id) AS n
      FROM pgmb_message) AS m
WHERE m.n <= %(kept)s
"""


def history_days(count: int) -> list[date]:
    today = datetime.now(UTC).date()
    return [today - timedelta(days=3 + k) for k in range(count)][::-1]


def fill(days: list[date], per_day: int, kept: int, whole: bool) -> None:
    """The history, in the days' partitions (``whole``) or in the default ones."""
    with harness.connect() as conn:
        conn.execute(
            "TRUNCATE pgmb_message, pgmb_attempt, pgmb_delivery, pgmb_archive_item,"
            " pgmb_archive_day, pgmb_archive_run"
        )
        made = {d for (d,) in conn.execute("SELECT day FROM pgmb.history_days()").fetchall()}
        if made & set(days):
            raise RuntimeError(f"days left from a run before: {sorted(made & set(days))}")
        if whole:
            conn.execute("SELECT pgmb.make_history_days(%s, %s)", (days[0], days[-1]))
        (queue,) = conn.execute("SELECT id FROM pgmb_queue LIMIT 1").fetchone()
        for day in days:
            conn.execute(FILL, {"n": per_day, "day": day})
        conn.execute(ATTEMPTS, {"queue": queue})
        conn.execute(KEPT, {"queue": queue, "kept": kept})
        conn.execute("VACUUM ANALYZE pgmb_message, pgmb_attempt, pgmb_delivery")
        where = dict(
            conn.execute(
                "SELECT tableoid::regclass::text LIKE '%%default', count(*) FROM pgmb_message"
                " GROUP BY 1"
            ).fetchall()
        )
    if where != {not whole: per_day * len(days)}:
        raise RuntimeError(f"the history is not where it should be: {where}")


def archive(days: list[date], per_day: int, kept: int, whole: bool, folder: str) -> harness.Sample:
    fill(days, per_day, kept, whole)
    output = tempfile.mkdtemp(prefix="archive-", dir=folder)
    command = [
        sys.executable, "-m", "pgmb.pipeline", "archive", "--older-than", "1",
        "--output", output, "--dsn", f"dbname={os.environ['PGMB_BENCH_DB']}", "--master", MASTER,
    ]  # fmt: skip
    started = time.monotonic()
    marks: dict[str, float] = {}
    lines: list[str] = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as job:
        assert job.stdout is not None
        for line in job.stdout:
            lines.append(line.rstrip())
            for phase, text in PHASES:
                if text in line and phase not in marks:
                    marks[phase] = time.monotonic() - started
    took = time.monotonic() - started
    report = "\n".join(lines)
    if job.returncode or len(marks) != len(PHASES):
        raise RuntimeError(f"the archive job failed:\n{report}")
    with harness.connect() as conn:
        left = conn.execute(
            "SELECT (SELECT count(*) FROM pgmb_message), (SELECT count(*) FROM pgmb_attempt),"
            " (SELECT count(*) FROM pg_class WHERE relname ~ '^pgmb_archive_[0-9]+_')"
        ).fetchone()
    if left != (kept * len(days), kept * len(days), 0):
        raise RuntimeError(f"ARCHIVE CHECK FAILED: messages, attempts, tables left {left}")
    sample = {"rate": per_day * len(days) / took, "total": took}
    previous = 0.0
    for phase, _ in PHASES:
        sample[phase] = marks[phase] - previous
        previous = marks[phase]
    sample["exit"] = took - previous
    held = re.search(r"held the history's locks ([\d.]+) s", report)
    sample["locks"] = float(held.group(1)) if held else 0.0
    REPORTS[whole] = report
    return sample


def set_up() -> None:
    from pgmb.models import Queue, Worker

    worker = Worker.objects.create(name="bench", endpoint="http://127.0.0.1:9/", rps=1000)
    Queue.objects.create(name="orders", binding_key="order.*", worker=worker)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=3, help="days of history (3)")
    parser.add_argument("--per-day", type=int, default=200_000, help="messages a day (200,000)")
    parser.add_argument("--kept", type=int, default=5, help="unfinished messages a day (5)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each variant (2)")
    parser.add_argument("--db", default="pgmb_bench_archive_days", help="scratch database")
    args = parser.parse_args(argv)
    days = history_days(args.days)

    with (
        tempfile.TemporaryDirectory(prefix="pgmb-bench-archive-") as folder,
        harness.scratch_database(args.db),
    ):
        set_up()
        harness.print_machine(spark=f"{MASTER} on {os.cpu_count()} cores")
        load = harness.OtherLoad(harness.postmaster())
        rows = harness.Case("rows", lambda: archive(days, args.per_day, args.kept, False, folder))
        whole = harness.Case("days", lambda: archive(days, args.per_day, args.kept, True, folder))
        results = harness.measure([(rows, whole)], args.rounds, load, budget=0)
    total = args.days * args.per_day
    print(
        f"\n{args.days} days of {args.per_day:,} finished messages (one ack attempt each) and "
        f"{args.kept} kept a day; seconds, median of {args.rounds} run(s) (range):"
    )
    keys = ["total"] + [p for p, _ in PHASES] + ["exit", "locks"]
    print(f"  {'':<8}" + "".join(f" {k:>17}" for k in keys))
    for case in (rows, whole):
        cells = []
        for key in keys:
            values = results.values(case.label, key)
            digits = 2 if key == "locks" else 1
            cells.append(
                f"{harness.median(values):6.{digits}f} "
                f"({min(values):.{digits}f}-{max(values):.{digits}f})"
            )
        print(f"  {case.label:<8}" + "".join(f" {c:>17}" for c in cells))
    ratio = harness.median(results.values(rows.label, "total")) / harness.median(
        results.values(whole.label, "total")
    )
    print(f"  rows/days, end to end: {ratio:.2f}; {total:,} messages a run")
    if note := results.load_note():
        print(f"  During the runs, {note}.")
    for whole_, report in REPORTS.items():
        name = "days" if whole_ else "rows"
        print(f"\nThe last {name} run's report:\n  " + report.replace("\n", "\n  "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
