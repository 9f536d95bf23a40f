"""The Spark pipeline's throughput: the ``publish`` and ``archive`` jobs against one process
COPYing.

    scripts/with-cluster.sh .venv/bin/python bench/pipeline.py [--messages 1000000] [--rounds 1]

In a scratch database with the queues of ``bench/publish.py`` (one bound to ``order.*``,
four that must get nothing): ``--messages`` order events written once to Parquet by Spark
(id, routing key, a ~120-byte JSON body), then, next to each other:

* **baseline**: one Python process COPYing the same kind of rows (generated in the
  process, not read from the file) into ``pgmb_message`` with psycopg, ``--batch-size``
  rows per COPY and transaction. COPY fires the routing trigger, so the baseline does the
  same routed writes as the job, without Spark, reading or checking;
* **publish**: ``python -m pgmb.pipeline publish FILE.parquet --master local[*] …`` as a
  user runs it: end to end (process start to exit: Spark's start, reading, checking every
  row, publishing) and the publishing phase alone (as the job reports it); then the same
  command again, every id already stored (the idempotent re-run);
* **archive**: the same number of messages, published two days ago and acked then (COPY,
  then one INSERT of the ack attempts), archived by ``python -m pgmb.pipeline archive
  --older-than 1`` end to end; every message and attempt must have left PostgreSQL. The
  issue's goal: at least 1,000,000 messages a minute (16,667/s).

The tables are emptied before each run; after each, every message must have exactly one
delivery, in the ``order.*`` queue. Each run takes minutes: ``--rounds`` defaults to 1 and
a run slowed down by other work is reported, not repeated.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.publish import MATCHING_BINDING, OTHER_BINDINGS, ROUTING_KEYS  # noqa: E402

MASTER = "local[*]"
#: When the archive case's history happened: before any --older-than of a day.
TWO_DAYS_AGO = datetime.now(timezone.utc) - timedelta(days=2)


def write_dataset(path: str, messages: int) -> None:
    """In a process of its own (Spark's JVM goes with it): the events, as Parquet."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = SparkSession.builder.master(MASTER).config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    n = F.col("id")
    keys = F.array(*map(F.lit, ROUTING_KEYS))
    line = F.struct(F.lit("A-1").alias("sku"), F.lit(2).alias("qty"))
    body = F.to_json(
        F.struct(
            n.alias("order_id"),
            F.format_string("c-%05d", n % 9973).alias("customer"),
            F.lit("129.90").alias("total"),
            F.lit("EUR").alias("currency"),
            F.array(line, line).alias("lines"),
        )
    )
    spark.range(messages).select(
        F.expr("uuid()").alias("id"),
        F.element_at(keys, (n % len(ROUTING_KEYS) + 1).cast("int")).alias("topic"),
        body.alias("body"),
    ).write.parquet(path)
    spark.stop()


def _body(n: int) -> str:
    return (
        f'{{"order_id":{n},"customer":"c-{n % 9973:05d}","total":"129.90","currency":"EUR",'
        '"lines":[{"sku":"A-1","qty":2},{"sku":"A-1","qty":2}]}'
    )


def empty_tables() -> None:
    with harness.connect() as conn:
        conn.execute("TRUNCATE pgmb_message, pgmb_delivery")


def copy_baseline(messages: int, batch: int) -> harness.Sample:
    """One process, psycopg COPY into pgmb_message, ``batch`` rows per transaction."""
    empty_tables()
    with harness.connect() as conn:
        started = time.monotonic()
        for first in range(0, messages, batch):
            with conn.transaction(), conn.cursor() as cursor:
                statement = "COPY pgmb_message (id, routing_key, body) FROM STDIN"
                with cursor.copy(statement) as copy:
                    for n in range(first, min(first + batch, messages)):
                        copy.write_row((uuid.uuid4(), ROUTING_KEYS[n % 3], _body(n)))
        took = time.monotonic() - started
    check_routing(messages)
    return {"rate": messages / took}


_SUMMARY = re.compile(r"([\d,]+) published.*?([\d,]+) rows/s \(([\d.]+) s publishing")


def _job(path: str, batch: int) -> tuple[float, int, float, str]:
    """Run the job; (seconds end to end, rows published, publishing rows/s, report)."""
    command = [
        sys.executable, "-m", "pgmb.pipeline", "publish", path,
        "--dsn", f"dbname={os.environ['PGMB_BENCH_DB']}", "--master", MASTER,
        "--key-column", "topic", "--body-column", "body", "--id-column", "id",
        "--batch-size", str(batch), "--progress-seconds", "60",
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    took = time.monotonic() - started
    if done.returncode:
        raise RuntimeError(f"the publish job failed:\n{done.stdout}\n{done.stderr[-3000:]}")
    found = _SUMMARY.search(done.stdout)
    if not found:
        raise RuntimeError(f"no summary in the job's report:\n{done.stdout}")
    published, rate = int(found.group(1).replace(",", "")), float(found.group(2).replace(",", ""))
    return took, published, rate, done.stdout


def publish_job(path: str, messages: int, batch: int, reports: list[str]) -> harness.Sample:
    empty_tables()
    took, published, rate, report = _job(path, batch)
    reports.append(report)
    if published != messages:
        raise RuntimeError(f"the job published {published:,} of {messages:,} messages")
    check_routing(messages)
    again, republished, _, report = _job(path, batch)
    reports.append(report)
    if republished:
        raise RuntimeError(f"the re-run published {republished:,} messages again")
    check_routing(messages)
    return {"rate": messages / took, "publishing": rate, "rerun": messages / again}


def finished_history(messages: int, batch: int) -> None:
    """``messages`` messages published two days ago (COPY, routed), each acked once then:
    what a nightly archive finds."""
    empty_tables()
    with harness.connect() as conn:
        conn.execute("TRUNCATE pgmb_attempt")
        for first in range(0, messages, batch):
            with conn.transaction(), conn.cursor() as cursor:
                statement = (
                    "COPY pgmb_message (id, routing_key, body, created_at, available_at) FROM STDIN"
                )
                with cursor.copy(statement) as copy:
                    for n in range(first, min(first + batch, messages)):
                        copy.write_row((uuid.uuid4(), ROUTING_KEYS[n % 3], _body(n), TWO_DAYS_AGO,
                                        TWO_DAYS_AGO))  # fmt: skip
        conn.execute(
            "INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code,"
            " duration_ms, error, created_at)"
            " SELECT message_id, queue_id, 1, 'ack', 200, 1.5, '', %s FROM pgmb_delivery",
            (TWO_DAYS_AGO,),
        )
        conn.execute("DELETE FROM pgmb_delivery")
        conn.execute("VACUUM ANALYZE pgmb_message, pgmb_attempt, pgmb_delivery")


def archive_job(messages: int, batch: int, folder: str) -> harness.Sample:
    """``archive --older-than 1`` of a finished history, end to end (process start to exit),
    into a new folder; every message and attempt must have left PostgreSQL."""
    finished_history(messages, batch)
    output = tempfile.mkdtemp(prefix="archive-", dir=folder)
    command = [
        sys.executable, "-m", "pgmb.pipeline", "archive", "--older-than", "1",
        "--output", output, "--dsn", f"dbname={os.environ['PGMB_BENCH_DB']}", "--master", MASTER,
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    took = time.monotonic() - started
    if done.returncode:
        raise RuntimeError(f"the archive job failed:\n{done.stdout}\n{done.stderr[-3000:]}")
    with harness.connect() as conn:
        (left,) = conn.execute(
            "SELECT (SELECT count(*) FROM pgmb_message) + (SELECT count(*) FROM pgmb_attempt)"
        ).fetchone()
    if left:
        raise RuntimeError(f"ARCHIVE CHECK FAILED: {left:,} rows left\n{done.stdout}")
    return {"rate": messages / took}


def check_routing(messages: int) -> None:
    """Every message delivered once, to the order.* queue and no other."""
    with harness.connect() as conn:
        (stored,) = conn.execute("SELECT count(*) FROM pgmb_message").fetchone()
        per_queue = dict(
            conn.execute(
                "SELECT q.binding_key, count(*) FROM pgmb_delivery d"
                " JOIN pgmb_queue q ON q.id = d.queue_id GROUP BY q.binding_key"
            ).fetchall()
        )
    if stored != messages or per_queue != {MATCHING_BINDING: messages}:
        raise RuntimeError(
            f"ROUTING CHECK FAILED: {stored:,} messages of {messages:,}; deliveries {per_queue}"
        )


def set_up() -> None:
    from pgmb.models import Queue, Worker

    worker = Worker.objects.create(name="bench", endpoint="http://127.0.0.1:9/", rps=1000)
    Queue.objects.create(name="order_queue", binding_key=MATCHING_BINDING, worker=worker)
    for name, binding in OTHER_BINDINGS.items():
        Queue.objects.create(name=name, binding_key=binding, worker=worker)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="(default 1,000,000)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each case (default 1)")
    parser.add_argument("--batch-size", type=int, default=5000, help="rows per COPY (5000)")
    parser.add_argument("--db", default="pgmb_bench_pipeline", help="scratch database")
    parser.add_argument("--keep", action="store_true", help="do not drop the database")
    args = parser.parse_args(argv)

    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pgmb-bench-pipeline-") as folder:
        path = str(Path(folder) / "events.parquet")
        writer = mp.get_context("spawn").Process(target=write_dataset, args=(path, args.messages))
        writer.start()
        writer.join()
        if writer.exitcode:
            print("writing the dataset failed")
            return 1
        with harness.scratch_database(args.db, args.keep):
            set_up()
            harness.print_machine(
                spark=f"{MASTER} on {os.cpu_count()} cores",
                dataset=f"{args.messages:,} messages in Parquet, "
                f"{sum(f.stat().st_size for f in Path(path).glob('*.parquet')) / 1e6:.0f} MB",
            )
            load = harness.OtherLoad(harness.postmaster())
            reports: list[str] = []
            baseline = harness.Case(
                f"baseline: 1 process, COPY {args.batch_size:,}/transaction",
                lambda: copy_baseline(args.messages, args.batch_size),
            )
            job = harness.Case(
                f"publish job, {MASTER}",
                lambda: publish_job(path, args.messages, args.batch_size, reports),
            )
            archive = harness.Case(
                f"archive job, {MASTER}",
                lambda: archive_job(args.messages, args.batch_size, folder),
            )
            # Minutes per run: a loaded run is reported (below), not repeated.
            results = harness.measure(
                [(baseline, job), (baseline, archive)], args.rounds, load, budget=0
            )
    print(
        f"\nmessages/s: best of {args.rounds} run(s) of {args.messages:,} messages each; "
        "ratio = against the baseline's best."
    )
    harness.print_table(
        results,
        [
            harness.Row(baseline.label, baseline.label),
            harness.Row("publish job, end to end", job.label, baseline=baseline.label),
            harness.Row("publish job, publishing phase", job.label, "publishing", baseline.label),
            harness.Row("publish job, re-run (all ids stored)", job.label, "rerun", baseline.label),
            harness.Row("archive job, end to end", archive.label, baseline=baseline.label),
        ],
        harness.best,
    )
    print("\nThe job's last report:\n  " + "\n  ".join(reports[-2].strip().splitlines()))
    print(
        f"\nrouting check: after every run, {args.messages:,} messages, each delivered once to "
        f"{MATCHING_BINDING} and to no other queue; {time.monotonic() - began:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
