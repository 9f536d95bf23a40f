"""Hourly delivery statistics per queue and worker, from the attempt history.

    stats [--since ISO | --hours N] [--include-archive PATH] [--output PATH]

For every UTC hour with attempts, and every queue (with its worker), every worker over
all its queues, and all queues together: attempts, delivered (acks), failed (retried,
dead-lettered, expired), attempts per delivered message, the latency from publishing to
the ack (p50/p95/p99, ``percentile_approx``) and the three most frequent error statuses.
The rows are upserted into ``pgmb_statistics`` (:class:`pgmb.models.HourlyStatistics`,
read with :mod:`pgmb.hourly_stats`) and, with ``--output``, written as Parquet.

The attempts come from PostgreSQL (Spark's JDBC source, split into ranges of the attempt
id) and, with ``--include-archive PATH``, from the archive's Parquet datasets
``PATH/attempts`` and ``PATH/messages`` (read with Spark's partition discovery, whatever
they are partitioned by); an attempt in both counts once. The window starts at the whole
hour of ``--since`` (or ``--hours`` before now), so that a re-run over the same hours
recomputes them whole and leaves the same rows.
"""

from __future__ import annotations

import argparse
import datetime
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .. import sql
from ..db.error_text import first_line
from ..errors import PipelineError
from . import no_history
from .cli import Output, positive_int, say
from .hourly import ALL, attempt_rows, figures
from .jdbc import read_ranges, subquery
from .postgres import Database

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

UTC = datetime.timezone.utc
#: The archive's datasets this job reads, and the columns it needs of each.
ARCHIVE_ATTEMPTS = (
    "id",
    "message_id",
    "queue_id",
    "attempt",
    "outcome",
    "status_code",
    "created_at",
)
ARCHIVE_MESSAGES = ("id", "created_at")
#: The attempts as this job works on them, from either source.
ATTEMPTS_SCHEMA = (
    "id long, message_id string, queue_id string, attempt int, outcome string, "
    "status_code int, created_at timestamp, published_at timestamp, "
    "queue_hint string, worker_hint string"
)
#: The columns of a row of :func:`~pgmb.pipeline.hourly.figures`, in the order of the
#: named statement ``copy``.
COLUMNS = (
    "hour",
    "queue_name",
    "worker_name",
    "attempts",
    "delivered",
    "failed",
    "retried",
    "dead_lettered",
    "expired",
    "attempts_per_message",
    "latency_p50_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "top_errors",
)


def _statement(name: str) -> str:
    return sql.query("statistics.sql", name)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This job's own options."""
    parser.add_argument(
        "--since",
        metavar="ISO",
        help="first hour to compute: an ISO date or time, UTC unless it names an offset "
        "(default: the whole history)",
    )
    parser.add_argument(
        "--hours",
        type=positive_int,
        metavar="N",
        help="compute the last N hours and the current one (instead of --since)",
    )
    parser.add_argument(
        "--include-archive",
        metavar="PATH",
        help="also count the archive's attempts (PATH/attempts and PATH/messages, Parquet)",
    )
    parser.add_argument(
        "--output", metavar="PATH", help="also write the rows as Parquet (replaced each run)"
    )


# The window.


def parse_since(text: str) -> datetime.datetime:
    """``--since``: an ISO 8601 date or date and time; without an offset, UTC."""
    value = text.strip()
    try:
        when = datetime.datetime.fromisoformat(
            value[:-1] + "+00:00" if value[-1:] in "Zz" else value
        )
    except ValueError:
        raise PipelineError(
            f"--since {text!r}: not an ISO date or time (like 2024-05-01 or 2024-05-01T10:00Z)"
        ) from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def hour_of(when: datetime.datetime) -> datetime.datetime:
    """The start of ``when``'s UTC hour."""
    return when.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def window_start(
    since: str | None, hours: int | None, now: datetime.datetime
) -> datetime.datetime | None:
    """The first hour to compute (a whole UTC hour), or None for the whole history."""
    if since is not None and hours is not None:
        raise PipelineError("--since and --hours exclude each other: give one")
    if since is not None:
        return hour_of(parse_since(since))
    if hours is not None:
        return hour_of(now) - datetime.timedelta(hours=hours)
    return None


# The archive's paths.


def _local(path: str) -> str | None:
    """The local file system path of ``path``, or None for another file system's URI."""
    parts = urlsplit(path)
    if parts.scheme == "file":
        return parts.path
    return None if parts.scheme and len(parts.scheme) > 1 else path


def check_paths(archive: str | None, output: str | None) -> None:
    """Refuse an archive that is not there and an output inside the archive, before
    anything is read or written (other file systems are left to Spark to check)."""
    if archive is not None:
        local = _local(archive)
        if local is not None:
            for name in ("", "attempts", "messages"):
                folder = os.path.join(local, name)
                if not os.path.isdir(folder):
                    raise PipelineError(f"--include-archive {archive}: no folder {folder}")
                if not os.access(folder, os.R_OK | os.X_OK):
                    raise PipelineError(f"--include-archive {archive}: {folder} is not readable")
    if archive is not None and output is not None:
        a, o = _local(archive), _local(output)
        if a is not None and o is not None:
            a, o = os.path.realpath(a), os.path.realpath(o)
            if o == a or o.startswith(a + os.sep):
                raise PipelineError(
                    f"--output {output} is inside the archive {archive}: each run replaces it"
                )


# Reading the attempts.


def _spark_error(e: Exception) -> str:
    """The first line of a Spark error, without Java's stack."""
    return first_line(e)


def read_names(database: Database) -> list[tuple[str, str, str]]:
    """(queue id, queue name, worker name) of every queue."""
    with database.connect() as conn:
        return [tuple(row) for row in conn.execute(_statement("names")).fetchall()]


def read_database(
    spark: SparkSession, database: Database, start: datetime.datetime | None, partitions: int
) -> tuple[DataFrame | None, int]:
    """The attempts since ``start`` in PostgreSQL (None if there are none), and how many."""
    from pyspark.sql import functions as F

    with database.connect() as conn:
        row = conn.execute(_statement("bounds"), {"since": start}).fetchone()
    if not row or not row[2]:
        return None, 0
    low, high, n = int(row[0]), int(row[1]), int(row[2])
    frame = read_ranges(
        spark, database, subquery(_statement("attempts"), "attempts"), "id", low, high, partitions
    )
    # Cut at the newest attempt of the first query, so that the figures are of one set of
    # attempts however long the read takes.
    frame = frame.where((F.col("id") >= low) & (F.col("id") <= high))
    if start is not None:
        # Compared in Spark, as instants: a timestamp pushed down to JDBC is written out
        # as a local time whose zone the driver and the server may not agree on.
        frame = frame.where(F.unix_micros("created_at") >= _micros(start))
    return (
        frame.select(
            "id",
            "message_id",
            "queue_id",
            "attempt",
            "outcome",
            "status_code",
            "created_at",
            "published_at",
            F.lit(None).cast("string").alias("queue_hint"),
            F.lit(None).cast("string").alias("worker_hint"),
        ),
        n,
    )


def _micros(when: datetime.datetime) -> int:
    return int(when.timestamp()) * 1_000_000 + when.microsecond


def _parquet(spark: SparkSession, path: str, what: str, needs: Sequence[str]) -> DataFrame:
    from pyspark.errors import PySparkException

    try:
        frame = spark.read.parquet(path)
    except PySparkException as e:
        raise PipelineError(
            f"cannot read the archive's {what} at {path}: {_spark_error(e)}"
        ) from None
    missing = [c for c in needs if c not in frame.columns]
    if missing:
        raise PipelineError(f"the archive's {what} at {path} have no column {', '.join(missing)}")
    return frame


def read_archive(spark: SparkSession, path: str, start: datetime.datetime | None) -> DataFrame:
    """The archive's attempts since ``start``, with their messages' publishing times.

    Assumed layout: Parquet datasets ``PATH/attempts`` and ``PATH/messages`` with the
    columns of ``pgmb_attempt`` and ``pgmb_message``, partitioned any way (the archive job
    writes ``day=YYYY-MM-DD/queue=NAME``). Extra columns are ignored; ``queue_name`` or a
    ``queue`` partition, and ``worker_name``, name queues that the database no longer has.
    """
    from pyspark.sql import functions as F

    base = path.rstrip("/")
    attempts = _parquet(spark, f"{base}/attempts", "attempts", ARCHIVE_ATTEMPTS)
    messages = _parquet(spark, f"{base}/messages", "messages", ARCHIVE_MESSAGES)
    if start is not None:
        if "day" in attempts.columns:
            # A filter on the partition column alone: Spark skips the older days' folders
            # (a day early, should the archive's days not be UTC ones).
            first_day = (start - datetime.timedelta(days=1)).date().isoformat()
            attempts = attempts.where(F.col("day").cast("string") >= first_day)
        attempts = attempts.where(F.col("created_at").cast("timestamp") >= F.lit(start))
    queue_id = F.col("queue_id").cast("string")
    hints: list[Column] = []
    if "queue_name" in attempts.columns:
        hints.append(F.col("queue_name").cast("string"))
    if "queue" in attempts.columns:
        queue = F.col("queue").cast("string")
        hints.append(F.when(queue != queue_id, queue))
    queue_hint = F.coalesce(*hints) if hints else F.lit(None).cast("string")
    worker_hint = (
        F.col("worker_name").cast("string")
        if "worker_name" in attempts.columns
        else F.lit(None).cast("string")
    )
    # A message may be archived under each of its queues: one publishing time per id.
    published = messages.groupBy(F.col("id").cast("string").alias("message_id")).agg(
        F.min(F.col("created_at").cast("timestamp")).alias("published_at")
    )
    return attempts.select(
        F.col("id").cast("long").alias("id"),
        F.col("message_id").cast("string").alias("message_id"),
        queue_id.alias("queue_id"),
        F.col("attempt").cast("int").alias("attempt"),
        F.col("outcome").cast("string").alias("outcome"),
        F.col("status_code").cast("int").alias("status_code"),
        F.col("created_at").cast("timestamp").alias("created_at"),
        queue_hint.alias("queue_hint"),
        worker_hint.alias("worker_hint"),
    ).join(published, "message_id", "left")


def combine(stored: DataFrame | None, archived: DataFrame | None) -> DataFrame | None:
    """The attempts of both sources, each id once (the archive may still hold rows that
    a crashed archive run left in PostgreSQL too)."""
    from pyspark.sql import functions as F

    columns = [c.split()[0] for c in ATTEMPTS_SCHEMA.split(", ")]
    frames = [f.select(*columns) for f in (stored, archived) if f is not None]
    if not frames:
        return None
    if len(frames) == 1:
        return frames[0]
    both = frames[0].unionByName(frames[1])
    # Copies are equal but for what one side lacks (a publishing time, a name): max()
    # takes the value where there is one.
    return both.groupBy("id").agg(*(F.max(c).alias(c) for c in columns if c != "id"))


# Writing.


def _rows(frame: DataFrame) -> Iterator[tuple[Any, ...]]:
    for row in frame.toLocalIterator():
        values = [row[c] for c in COLUMNS]
        values[0] = datetime.datetime.fromtimestamp(values[0], UTC)
        yield tuple(values)


def write_parquet(frame: DataFrame, output: str) -> None:
    """The rows as one Parquet dataset at ``output`` (replacing what was there)."""
    from pyspark.sql import functions as F

    try:
        rows = frame.withColumn("hour", F.timestamp_seconds("hour"))
        rows.write.mode("overwrite").parquet(output)
    except Exception as e:  # a PySparkException, or Py4J's error for one Spark did not map
        raise PipelineError(f"cannot write --output {output}: {_spark_error(e)}") from None


def upsert(database: Database, rows: Iterator[tuple[Any, ...]]) -> dict[str, int]:
    """Rows into ``pgmb_statistics`` in one transaction, replacing the hours they are of;
    how many rows were new, changed, unchanged and removed."""
    with database.connect() as conn, conn.transaction():
        conn.execute(_statement("staging"))
        staged = 0
        with conn.cursor().copy(_statement("copy")) as copy:
            for row in rows:
                copy.write_row(row)
                staged += 1
        removed = conn.execute(_statement("stale")).rowcount
        written = conn.execute(_statement("upsert")).fetchall()
    new = sum(1 for (inserted,) in written if inserted)
    return {
        "new": new,
        "changed": len(written) - new,
        "unchanged": staged - len(written),
        "removed": removed,
    }


def validate(options: argparse.Namespace) -> None:
    """The window and the paths, checked before Spark starts."""
    window_start(options.since, options.hours, datetime.datetime.now(UTC))
    check_paths(options.include_archive, options.output)


def run(spark: SparkSession, database: Database, options: argparse.Namespace, out: Output) -> int:
    """Compute the hours of the window and upsert them; the report goes to ``out``."""
    start = window_start(options.since, options.hours, datetime.datetime.now(UTC))
    since = f"since {start:%Y-%m-%d %H:00} UTC" if start else "of the whole history"
    stored, n = read_database(spark, database, start, options.partitions)
    parts = stored.rdd.getNumPartitions() if stored is not None else 0
    say(out, f"stats: {n} attempts in PostgreSQL {since} (JDBC partitions: {parts})")
    with database.connect() as conn:
        unkept = no_history.note("stats", no_history.queues(conn))
    if unkept:
        say(out, unkept)
    archived = None
    if options.include_archive:
        archived = read_archive(spark, options.include_archive, start)
        say(out, f"stats: and the archive's at {options.include_archive}")
    attempts = combine(stored, archived)
    names = spark.createDataFrame(
        read_names(database), "queue_id string, queue_name string, worker_name string"
    )
    if attempts is None:
        attempts = spark.createDataFrame([], ATTEMPTS_SCHEMA)
    # Read once: the counts and the error statuses are two aggregations of it.
    base = attempt_rows(attempts, names).persist()
    # Hourly rows are few (hours by queues): one partition, read by the driver in one go
    # and written as one Parquet file.
    result = figures(base).coalesce(1).cache()
    try:
        try:
            rows = result.count()
            hours = result.where((result.queue_name == ALL) & (result.worker_name == ALL)).count()
        except Exception as e:  # a PySparkException, or Py4J's error for one Spark did not map
            raise PipelineError(f"cannot compute the statistics: {_spark_error(e)}") from None
        finally:
            base.unpersist()
        if not rows:
            say(out, f"stats: no attempts {since}: nothing to write")
            return 0
        say(out, f"stats: {rows} rows over {hours} hours")
        if options.output:
            write_parquet(result, options.output)
            say(out, f"stats: wrote {rows} rows to {options.output}")
        done = upsert(database, _rows(result))
        say(out, "stats: pgmb_statistics: " + ", ".join(f"{k} {what}" for what, k in done.items()))
        return 0
    finally:
        result.unpersist()
