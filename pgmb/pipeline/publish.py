"""Bulk-publish a dataset (Parquet, JSON Lines, CSV) into pgmb through Spark partitions.

    publish INPUT [--format parquet|jsonl|csv] (--key-column COL | --key KEY)
                  (--body-column COL | --body-columns A,B,C) [--headers-column COL]
                  [--delay-column COL | --delay DELAY] [--id-column COL] [--refused FILE]
                  [--batch-size N]

Three steps. Spark reads the dataset and every row is checked by pgmb's own rules on the
executors; one bad row stops the run with one line naming the first few (file and row)
before anything is written. Then each partition publishes its rows in batches, each one
routed insert into ``pgmb_message`` (the routing trigger creates the deliveries, as for
:func:`pgmb.send_batch`); a row that breaks a message limit is refused on its own, and the
summary counts those and names the first few, where they are and why. With
``--id-column`` the run is idempotent: an id already stored is skipped, so a re-run (after
a crash, or by mistake) publishes nothing twice. Without one, ids are generated and a
re-run publishes every row again. Progress is reported while it runs, a summary at the end.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import threading
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pgmb import sql
from pgmb.durations import parse_delay
from pgmb.errors import PgmbError
from pgmb.routing import validate_routing_key

from ..db.error_text import first_line
from ..errors import PipelineError
from .cli import Output, positive_int, say
from .postgres import Database
from .publish_input import (
    FORMATS,
    Columns,
    check_readable,
    input_format,
    local_path,
    prepare,
    read,
    spark_reason,
)
from .publish_rows import (
    CHECKED,
    EXAMPLES,
    WRITTEN,
    Bad,
    Plan,
    Written,
    check_partition,
    write_partition,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Rows in a batch: one COPY and one routed INSERT, one transaction (docs/benchmarks.md).
DEFAULT_BATCH_SIZE = 5000
#: Rows per Spark task at most: progress is counted as tasks finish.
ROWS_PER_TASK = 50_000
#: Seconds between two progress lines.
DEFAULT_PROGRESS_SECONDS = 10.0


def _column_list(text: str) -> tuple[str, ...]:
    names = tuple(c.strip() for c in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected column names separated by commas: {text!r}")
    return names


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, at least 0: {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The dataset and which of its columns make the messages."""
    parser.add_argument("input", metavar="INPUT", help="a file, folder or glob; local or a URI")
    parser.add_argument(
        "--format", choices=FORMATS, help="default: from INPUT's extension (.parquet, .jsonl, .csv)"
    )
    key = parser.add_mutually_exclusive_group(required=True)
    key.add_argument("--key-column", metavar="COL", help="the routing key of each row")
    key.add_argument("--key", metavar="KEY", help="one routing key for every row")
    body = parser.add_mutually_exclusive_group(required=True)
    body.add_argument(
        "--body-column", metavar="COL", help="the body: JSON text, or a struct, map or array"
    )
    body.add_argument(
        "--body-columns",
        metavar="A,B,C",
        type=_column_list,
        help="these columns become the body, a JSON object",
    )
    parser.add_argument(
        "--headers-column", metavar="COL", help="headers: a JSON object's text, a struct or map"
    )
    delay = parser.add_mutually_exclusive_group()
    delay.add_argument(
        "--delay-column",
        metavar="COL",
        help="seconds, a timestamp, or a text such as 30, 10m, 2026-12-01T10:00:00Z",
    )
    delay.add_argument("--delay", metavar="DELAY", help="one delay for every row (30, 10m, …)")
    parser.add_argument(
        "--id-column",
        metavar="COL",
        help="message ids (UUIDs): a re-run skips those already published",
    )
    parser.add_argument(
        "--refused",
        metavar="FILE",
        help="write every row the message limits refuse to this local file, one JSON object "
        "a line: file, row, id, reason",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=DEFAULT_BATCH_SIZE,
        help=f"rows per insert (default {DEFAULT_BATCH_SIZE})",
    )
    parser.add_argument(
        "--progress-seconds",
        type=_seconds,
        default=DEFAULT_PROGRESS_SECONDS,
        help=f"seconds between progress lines (default {DEFAULT_PROGRESS_SECONDS:g})",
    )


def _constant_delay(text: str | None) -> tuple[float | None, str | None]:
    if text is None:
        return None, None
    try:
        parsed = parse_delay(text)
    except PgmbError as e:
        raise PipelineError(f"--delay: {e}") from None
    if isinstance(parsed, datetime):
        return None, parsed.astimezone(timezone.utc).isoformat()
    return parsed, None


def _patterns(database: Database) -> tuple[str, ...]:
    with database.connect() as conn:
        rows = conn.execute(sql.query("pipeline_publish.sql", "queues")).fetchall()
    return tuple(pattern for (pattern,) in rows)


def _where(staged: DataFrame, bad: Bad) -> str:
    """``row N of FILE``: N counts the records of that file as Spark read them (for JSON
    Lines, the line number when the file has no blank lines)."""
    from pyspark.sql import functions as F

    (file,) = staged.where(F.col("pos") == bad.pos).select("file").first() or ("?",)
    before = staged.where((F.col("file") == file) & (F.col("pos") < bad.pos)).count()
    shown = local_path(file) or file
    return f"row {before + 1} of {shown}" + (f" (id {bad.id})" if bad.id else "")


def _check(staged: DataFrame, plan: Plan, path: str) -> int:
    """Every row checked on the executors; the number of rows, or the first few bad ones."""
    check = functools.partial(check_partition, plan=plan)
    checked = staged.select(*CHECKED).rdd.mapPartitions(check).collect()
    rows = sum(c.rows for c in checked)
    bad = sum(c.bad for c in checked)
    if bad:
        examples = sorted((b for c in checked for b in c.examples), key=lambda b: b.pos)[:3]
        shown = "; ".join(f"{_where(staged, b)}: {b.problem}" for b in examples)
        raise PipelineError(
            f"{bad:,} of {rows:,} rows of {path} cannot be published, so none was: {shown}"
        )
    return rows


_FAILED = re.compile(r"PublishFailed: (.*)")


def _write(
    spark: SparkSession, staged: DataFrame, plan: Plan, rows: int, every: float, out: Output
) -> list[Written]:
    """Publish every partition; progress lines while the tasks finish."""
    progress = spark.sparkContext.accumulator(0)
    done: dict[str, Any] = {}

    def action() -> None:
        write = functools.partial(write_partition, plan=plan, progress=progress)
        try:
            done["written"] = staged.select(*WRITTEN).rdd.mapPartitions(write).collect()
        except Exception as e:  # reported on the driver's thread, below
            done["error"] = e

    started = time.monotonic()
    worker = threading.Thread(target=action, name="pgmb publish", daemon=True)
    worker.start()
    shown, last = 0, started
    while worker.is_alive():
        worker.join(timeout=max(min(every, 1.0), 0.05))
        value, now = progress.value, time.monotonic()
        if worker.is_alive() and value > shown and now - last >= every:
            rate = value / (now - started)
            say(out, f"publish: {value:,} of {rows:,} rows published ({rate:,.0f} rows/s)")
            shown, last = value, now
    if "error" in done:
        error = done["error"]
        found = _FAILED.search(str(error))
        reason = found.group(1).strip() if found else first_line(error)
        counted = f" ({progress.value:,} rows in finished tasks)" if progress.value else ""
        advice = (
            "run the same command again to publish the rest (ids already stored are skipped)"
            if plan.has_id
            else "without --id-column, running it again would publish those again"
        )
        raise PipelineError(
            f"publishing stopped: {reason}; the batches committed before stay "
            f"published{counted}: {advice}"
        )
    written: list[Written] = done["written"]
    return written


def validate(options: argparse.Namespace) -> None:
    """What can be checked before Spark starts: the format, the path, ``--key``, ``--delay``,
    the folder of ``--refused``."""
    input_format(options.input, options.format)
    check_readable(options.input)
    if options.key is not None:
        try:
            validate_routing_key(options.key)
        except PgmbError as e:
            raise PipelineError(f"--key: {e}") from None
    _constant_delay(options.delay)
    if options.refused is not None:
        folder = os.path.dirname(os.path.abspath(options.refused))
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PipelineError(f"--refused: cannot write in {folder}")


def run(spark: SparkSession, database: Database, options: argparse.Namespace, out: Output) -> int:
    """Read, check every row, publish; one summary line (``validate`` has run)."""
    started = time.monotonic()
    path: str = options.input
    fmt = input_format(path, options.format)
    seconds, at = _constant_delay(options.delay)
    columns = Columns(
        key=options.key_column,
        body=options.body_column,
        body_columns=options.body_columns or (),
        headers=options.headers_column,
        delay=options.delay_column,
        id=options.id_column,
    )
    raw_json = {c for c in (columns.body, columns.headers) if c}
    messages = prepare(read(spark, path, fmt, raw_json), columns, path, fmt, options.key)
    plan = Plan(
        dsn=database.dsn,
        batch_size=options.batch_size,
        has_id=columns.id is not None,
        seconds=seconds,
        at=at,
        patterns=_patterns(database),
        every_refusal=options.refused is not None,
    )

    from py4j.protocol import Py4JError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    staged = None
    try:
        try:
            staged = _stage(messages, plan, options.partitions)
            rows = _check(staged, plan, path)
        except (PySparkException, Py4JError) as e:  # a file that turns out unreadable
            raise PipelineError(f"cannot read {path} as {fmt}: {spark_reason(e)}") from None
        say(
            out,
            f"publish: {rows:,} rows of {path} ({fmt}) checked, all can be published "
            f"({time.monotonic() - started:.1f} s)",
        )
        if not rows:
            say(out, "publish: nothing to publish")
            return 0
        began = time.monotonic()
        written = _write(spark, staged, plan, rows, options.progress_seconds, out)
        writing = time.monotonic() - began
        _summary(out, written, plan, writing, time.monotonic() - started)
        _report_refused(out, staged, written, options.refused)
    finally:
        if staged is not None:
            staged.unpersist()
    return 0


def _stage(messages: DataFrame, plan: Plan, partitions: int) -> DataFrame:
    """The rows spread over the tasks that check and publish them, kept for both passes."""
    from pyspark.sql import functions as F

    tasks = max(partitions, math.ceil(messages.count() / ROWS_PER_TASK))
    # By id: copies of one message land in one task, which publishes one of them.
    by = [F.col("id")] if plan.has_id else []
    return messages.repartition(tasks, *by).persist()


def _report_refused(
    out: Output, staged: DataFrame, written: list[Written], record: str | None
) -> None:
    """One line for the rows the message limits refused: how many, and the first few with
    where they are and why (their reasons are pgmb.message_limits' words); with
    ``record`` (``--refused``), every one of them in that file."""
    refused = sum(w.refused for w in written)
    every = sorted((b for w in written for b in w.refusals), key=lambda b: b.pos)
    if record is not None:
        _record_refused(staged, every, record)
    if not refused:
        return
    shown = "; ".join(f"{_where(staged, b)}: {b.problem}" for b in every[:EXAMPLES])
    say(
        out,
        f"publish: warning: {refused:,} rows break the message limits and were not "
        f"published" + (f" (every one in {record})" if record else "") + f": {shown}",
    )


def _record_refused(staged: DataFrame, refused: list[Bad], path: str) -> None:
    """``path`` as JSON Lines: per refused row its file, row (as :func:`_where` counts),
    id and reason; an empty file when none was. One Spark job numbers the rows of each
    file, only when some were refused."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    where: dict[int, tuple[str, int]] = {}
    if refused:
        numbered = staged.select("pos", "file").withColumn(
            "row", F.row_number().over(Window.partitionBy("file").orderBy("pos"))
        )
        wanted = numbered.where(F.col("pos").isin([b.pos for b in refused]))
        where = {r["pos"]: (r["file"], r["row"]) for r in wanted.collect()}
    try:
        with open(path, "w", encoding="utf-8") as f:
            for b in refused:
                file, row = where[b.pos]
                shown = local_path(file) or file
                record = {"file": shown, "row": row, "id": b.id, "reason": b.problem}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    except OSError as e:
        raise PipelineError(f"--refused: cannot write {path}: {e.strerror or e}") from None


def _summary(out: Output, written: list[Written], plan: Plan, writing: float, whole: float) -> None:
    rows = sum(w.rows for w in written)
    inserted = sum(w.inserted for w in written)
    refused = sum(w.refused for w in written)
    deliveries = sum(w.deliveries for w in written)
    unrouted = sum(w.unrouted for w in written)
    say(
        out,
        f"publish: {rows:,} rows read, {inserted:,} published, "
        + (f"{refused:,} refused, " if refused else "")
        + f"{rows - inserted - refused:,} skipped as duplicates, {deliveries:,} deliveries "
        f"routed; {rows / max(writing, 1e-9):,.0f} rows/s ({writing:.1f} s publishing, "
        f"{whole:.1f} s in all)",
    )
    if unrouted:
        keys = sorted({k for w in written for k in w.unrouted_keys})[:3]
        say(
            out,
            f"publish: warning: {unrouted:,} messages matched no queue and will not be "
            f"delivered (routing keys such as {', '.join(map(repr, keys))})",
        )
    if not plan.has_id:
        say(
            out,
            "publish: the ids were generated (no --id-column): running this again publishes "
            "these rows again",
        )
