"""Archive finished messages and their attempts to Parquet, then delete them from PostgreSQL.

A message is finished when it has no live delivery and no dead letter (acked everywhere,
dead-lettered and then purged, or routed to no queue). Those published and last attempted
before the cutoff (``--older-than`` days ago, by the database's clock) are archived under
``--output``, a local path or any Hadoop URI::

    messages/run=N/day=YYYY-MM-DD/part-….parquet           one row per message
    attempts/run=N/day=YYYY-MM-DD/queue=NAME/part-….parquet one row per attempt
    _staging/run=N/…                                        a run being written

``day`` is the UTC date of the message's publication (messages) or of the attempt
(attempts); ``queue`` is the queue's name (null once the queue is deleted). Spark reads the
whole archive with ``spark.read.parquet(OUTPUT + "/messages")`` (columns ``run`` and
``day`` come from the folders).

What is read: each day partition of the history whose UTC day (of the message ids)
ended before the cutoff is taken whole. ``pgmb.claim_history_day`` detaches its two tables
in one short transaction, after moving the messages that stay (unfinished, or attempted
after the cutoff) into the default partitions; Spark reads the detached tables whole, and
once the Parquet is committed the run drops them: retention without a row deleted. The
rows no day holds (the default and far partitions: ids producers gave, an upgraded
database's old rows, the messages kept from a day) are claimed one by one in
``pgmb_archive_item``, read, then deleted in short transactions of ``--batch-size``
messages. A day whose locks are not had within a second is left for the next run.

Crash safety: a run records what it takes in PostgreSQL first (``pgmb_archive_day``,
``pgmb_archive_item``), writes exactly those to ``_staging/run=N``, moves the committed
folders to ``messages/run=N`` and ``attempts/run=N``, checks the row counts, and records the
run as written. Only then are its days dropped and its rows deleted. The next run first
finishes what a written run left (drops, deletes), and throws away the files of a run that
stopped before it was written: its items are claimed again, its days (detached, seen by no
one) become the new run's. Killed at any point, a job loses nothing and archives nothing
twice. One archive job runs at a time (an advisory lock).
"""

from __future__ import annotations

import argparse
import functools
import time
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql as pgsql

from .. import sql
from ..archive_age import DEFAULT_OLDER_THAN_DAYS, days_problem
from ..errors import PipelineError
from . import jdbc, no_history
from .cli import Output, positive_int, say
from .hadoopfs import HadoopFS, Usage, reason
from .postgres import Database

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Messages claimed, then deleted, per transaction.
DEFAULT_BATCH_SIZE = 5_000
#: A long phase reports how far it got at most this often.
PROGRESS_SECONDS = 10.0

#: The archive's folders under --output; nothing else may be there.
MESSAGES, ATTEMPTS, STAGING = "messages", "attempts", "_staging"


def older_than_days(text: str) -> float:
    """An argparse type: a number of days, 0 or more (fractions allowed; 0: every
    finished message)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of days: {text!r}") from None
    problem = days_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(f"{problem}: {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The archive's options."""
    parser.add_argument(
        "--output",
        required=True,
        metavar="PATH_OR_URI",
        help="the archive's folder: a local path or a Hadoop URI (hdfs://…, s3a://…)",
    )
    parser.add_argument(
        "--older-than",
        type=older_than_days,
        metavar="DAYS",
        help="archive messages finished and older than this many days (default: "
        f"PGMB['PIPELINE_ARCHIVE_OLDER_THAN_DAYS'] under manage.py, else "
        f"{DEFAULT_OLDER_THAN_DAYS:g})",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=DEFAULT_BATCH_SIZE,
        metavar="N",
        help=f"messages claimed and deleted per transaction (default {DEFAULT_BATCH_SIZE})",
    )


@dataclass(frozen=True)
class Layout:
    """Where a run's files are, under the archive's root (a qualified URI)."""

    root: str

    def messages(self, run: int) -> str:
        return f"{self.root}/{MESSAGES}/run={run}"

    def attempts(self, run: int) -> str:
        return f"{self.root}/{ATTEMPTS}/run={run}"

    def staging(self, run: int) -> str:
        return f"{self.root}/{STAGING}/run={run}"


def check_output(fs: HadoopFS, output: str) -> Layout:
    """The archive at ``output``: a folder that is empty or holds an archive, and that this
    job can write in. Checked before the database is touched."""
    if not output.strip():
        raise PipelineError("--output is empty: name the archive's folder")
    try:
        root = fs.qualify(output).rstrip("/")
        if fs.exists(root):
            if not fs.is_dir(root):
                raise PipelineError(f"{root} is a file, not a folder")
            strangers = [
                name
                for name in fs.names(root)
                if name not in (MESSAGES, ATTEMPTS) and not name.startswith(("_", "."))
            ]
            if strangers:
                raise PipelineError(
                    f"{root} is not a pgmb archive: it holds {', '.join(strangers[:3])}"
                )
        fs.check_writable(f"{root}/{STAGING}")
    except PipelineError as e:
        raise PipelineError(f"--output {output}: {e}") from None
    return Layout(root)


def _for_run(name: str, run: int) -> str:
    """Statement ``name`` of archive.sql with ``{run}`` filled in as a literal: Spark's
    JDBC source takes a subquery, not parameters."""
    statement = pgsql.SQL(sql.query("archive.sql", name)).format(run=pgsql.Literal(run))
    return statement.as_string(None)


@dataclass(frozen=True)
class _Day:
    """A day a run took whole: its detached tables."""

    day: date
    messages: str
    attempts: str

    def statement(self, name: str) -> pgsql.Composed:
        """Statement ``name`` of archive.sql on this day's tables."""
        return pgsql.SQL(sql.query("archive.sql", name)).format(
            messages=pgsql.Identifier(self.messages), attempts=pgsql.Identifier(self.attempts)
        )


def _utc(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


class _Progress:
    """Reports a long phase's count, at most every PROGRESS_SECONDS: ``line`` is formatted
    with ``done``."""

    def __init__(self, out: Output, line: str) -> None:
        self.out, self.line = out, line
        self.last = time.monotonic()

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_SECONDS:
            self.last = now
            say(self.out, self.line.format(done=done))


@dataclass
class _Deleted:
    messages: int = 0
    attempts: int = 0
    batches: int = 0


class _Archiver:
    """One job: its database connection (holding the job lock), Spark and the files."""

    def __init__(
        self,
        spark: SparkSession,
        fs: HadoopFS,
        database: Database,
        conn: psycopg.Connection[Any],
        options: argparse.Namespace,
        out: Output,
    ) -> None:
        self.spark, self.fs, self.database, self.conn = spark, fs, database, conn
        self.partitions: int = options.partitions
        self.batch: int = options.batch_size
        self.out = out

    def _row(self, name: str, **params: Any) -> tuple[Any, ...]:
        row = self.conn.execute(sql.query("archive.sql", name), params).fetchone()
        assert row is not None  # every statement of the job returns one row
        return tuple(row)

    def _execute(self, name: str, **params: Any) -> int:
        return self.conn.execute(sql.query("archive.sql", name), params).rowcount

    def lock(self) -> None:
        if not self._row("lock_job")[0]:
            raise PipelineError(
                f"another archive job is running on {self.database.describe()}; "
                "run again when it has finished"
            )

    def finish_leftovers(self) -> None:
        """Complete what runs killed before left: delete the rows of a written run, throw
        away the files of one that was not written."""
        runs = self.conn.execute(sql.query("archive.sql", "unfinished_runs")).fetchall()
        for run, state, output in runs:
            if state == "written":
                say(
                    self.out,
                    f"run {run} stopped after its Parquet was committed under {output}: "
                    f"dropping its days and deleting its rows from PostgreSQL",
                )
                dropped = self.drop_days(run)
                if dropped:
                    say(self.out, f"run {run}: dropped the tables of {dropped} days it had left")
                deleted = self.delete(run, self._row("run_bounds", run=run)[0])
                say(
                    self.out,
                    f"run {run}: deleted the {deleted.messages} messages and "
                    f"{deleted.attempts} attempts it had left",
                )
            else:
                say(
                    self.out,
                    f"run {run} stopped before its Parquet was committed ({state}): "
                    f"discarding its files under {output} (the next run writes its days)",
                )
                self.discard(run, Layout(output))
        # A written run that a 0.1.1 job finished (it knows no days) left its days' tables.
        for (run,) in self.conn.execute(sql.query("archive.sql", "done_with_days")).fetchall():
            dropped = self.drop_days(run)
            say(self.out, f"run {run}: dropped the tables of {dropped} days it had left")

    def discard(self, run: int, layout: Layout) -> None:
        """Remove run ``run``'s files, then free its messages for a later run."""
        try:
            for folder in (layout.staging(run), layout.messages(run), layout.attempts(run)):
                self.fs.delete(folder)
        except PipelineError as e:
            raise PipelineError(f"cannot discard the files of unfinished run {run}: {e}") from None
        with self.conn.transaction():
            self._execute("release_items", run=run)
            self._execute("mark_discarded", run=run)

    def claim_days(self, run: int, cutoff: datetime) -> list[date]:
        """Take each day old enough whole, oldest first, a transaction each; the days left
        because their tables were busy."""
        busy: list[date] = []
        days = [
            d
            for (d,) in self.conn.execute(
                sql.query("archive.sql", "days_to_claim"), {"cutoff": cutoff}
            ).fetchall()
        ]
        taken, kept, longest = 0, 0, 0.0
        for day in days:
            started = time.monotonic()
            moved = self._row("claim_day", run=run, day=day, cutoff=cutoff)[0]
            if moved is None:
                busy.append(day)
                continue
            taken, kept = taken + 1, kept + moved
            longest = max(longest, time.monotonic() - started)
        if taken:
            # How long publishing, claims and settles waited at most.
            say(
                self.out,
                f"run {run}: detached {taken} days ({kept} messages kept in PostgreSQL); "
                f"the longest held the history's locks {longest:.2f} s",
            )
        return busy

    def days(self, run: int) -> list[_Day]:
        rows = self.conn.execute(sql.query("archive.sql", "days_of_run"), {"run": run})
        return [_Day(day, messages, attempts) for day, messages, attempts in rows.fetchall()]

    def count_days(self, run: int, days: list[_Day]) -> tuple[int, int]:
        """Count what each day's tables hold (nothing else writes them), record it; the
        sums."""
        total = (0, 0)
        for day in days:
            row = self.conn.execute(day.statement("count_day")).fetchone()
            assert row is not None
            messages, attempts = row
            self._execute(
                "record_day_counts", run=run, day=day.day, messages=messages, attempts=attempts
            )
            total = (total[0] + messages, total[1] + attempts)
        return total

    def drop_days(self, run: int) -> int:
        """Drop a written run's days, a transaction each."""
        days = self.days(run)
        for day in days:
            with self.conn.transaction():
                self.conn.execute(day.statement("drop_day"))
                self._execute("mark_day_dropped", run=run, day=day.day)
        return len(days)

    def claim(self, run: int, cutoff: datetime) -> int:
        """Claim the run's messages, a batch per transaction, in id order."""
        total, after = 0, None
        progress = _Progress(self.out, f"run {run}: {{done}} messages claimed so far …")
        while True:
            with self.conn.transaction():
                self._row("lock_claims")
                count, last = self._row(
                    "claim", run=run, after=after, cutoff=cutoff, limit=self.batch
                )
            total += count
            progress(total)
            if count < self.batch:
                return total
            after = last

    def read(self, run: int, name: str, lower: int, upper: int) -> DataFrame:
        """Statement ``name`` of the run, read in ranges of its items' ids."""
        table = jdbc.subquery(_for_run(name, run), "archived")
        return jdbc.read_ranges(
            self.spark, self.database, table, "item_id", lower, upper, self.partitions
        ).drop("item_id")

    def read_day(self, day: _Day, name: str) -> DataFrame:
        """Statement ``name`` on a day's tables, read whole by one Spark task."""
        statement = day.statement(name).as_string(None)
        return jdbc.read_whole(self.spark, self.database, jdbc.subquery(statement, "archived"))

    def frames(
        self, run: int, days: list[_Day], items: tuple[int, int] | None
    ) -> tuple[DataFrame, DataFrame]:
        """The run's messages and attempts: each day's tables, and its items (their id
        bounds; None: none)."""
        messages = [self.read_day(day, "messages_of_day") for day in days]
        attempts = [self.read_day(day, "attempts_of_day") for day in days]
        if items is not None:
            messages.append(self.read(run, "messages_of_run", *items))
            attempts.append(self.read(run, "attempts_of_run", *items))
        return functools.reduce(_union, messages), functools.reduce(_union, attempts)

    def write(
        self,
        run: int,
        layout: Layout,
        days: list[_Day],
        items: tuple[int, int] | None,
        want: tuple[int, int],
    ) -> Usage:
        """Write the run's messages and attempts, commit them, and check the counts
        (``want``: what PostgreSQL holds of them)."""
        from pyspark.sql import functions as F

        messages, attempts = self.frames(run, days, items)
        messages = messages.withColumn("day", F.to_date("created_at"))
        attempts = attempts.withColumn("day", F.to_date("created_at"))
        staging = layout.staging(run)
        self.fs.delete(staging)
        messages.write.mode("errorifexists").partitionBy("day").parquet(f"{staging}/{MESSAGES}")
        attempts.write.mode("errorifexists").partitionBy("day", "queue").parquet(
            f"{staging}/{ATTEMPTS}"
        )
        # Spark has committed both (its _SUCCESS); one rename each makes them part of the
        # archive. A crash before the run is marked written leaves folders the next run
        # deletes.
        self.fs.mkdirs(f"{layout.root}/{MESSAGES}")
        self.fs.mkdirs(f"{layout.root}/{ATTEMPTS}")
        self.fs.rename(f"{staging}/{MESSAGES}", layout.messages(run))
        self.fs.rename(f"{staging}/{ATTEMPTS}", layout.attempts(run))
        self.fs.delete(staging)

        want_messages, want_attempts = want
        got_messages = self.spark.read.schema(messages.schema).parquet(layout.messages(run))
        got_attempts = self.spark.read.schema(attempts.schema).parquet(layout.attempts(run))
        counts = (got_messages.count(), got_attempts.count())
        if counts != (want_messages, want_attempts):
            raise PipelineError(
                f"run {run}: the Parquet holds {counts[0]} messages and {counts[1]} attempts, "
                f"PostgreSQL {want_messages} and {want_attempts}; nothing was deleted (the "
                "next run writes them again)"
            )
        messages_usage = self.fs.usage(layout.messages(run))
        attempts_usage = self.fs.usage(layout.attempts(run))
        usage = Usage(
            messages_usage.files + attempts_usage.files,
            messages_usage.bytes + attempts_usage.bytes,
        )
        return usage

    def delete(self, run: int, total: int) -> _Deleted:
        """Delete a written run's rows, a batch per transaction, then mark it done."""
        deleted = _Deleted()
        progress = _Progress(self.out, f"run {run}: {{done}} of {total} messages deleted so far …")
        while True:
            items, messages, attempts = self._row("delete_batch", run=run, limit=self.batch)
            if not items:
                break
            deleted.messages += messages
            deleted.attempts += attempts
            deleted.batches += 1
            progress(deleted.messages)
        self._execute("mark_done", run=run)
        return deleted

    def archive(self, layout: Layout, days: float) -> None:
        """A new run: take the days and claim the rows, write, record, drop and delete."""
        run, cutoff = self._row("start_run", output=layout.root, seconds=days * 86_400)
        say(self.out, f"run {run}: messages finished before {_utc(cutoff)} …")
        if unkept := no_history.note("archive", no_history.queues(self.conn)):
            say(self.out, unkept)
        adopted = self._execute("adopt_days", run=run)
        if adopted:
            say(self.out, f"run {run}: takes over {adopted} days a stopped run had detached")
        for day in self.claim_days(run, cutoff):
            say(self.out, f"run {run}: day {day} left for the next run: its tables were busy")
        whole = self.days(run)
        claimed = self.claim(run, cutoff)
        if not claimed and not whole:
            self._execute("mark_done", run=run)
            say(self.out, f"nothing to archive: no finished message older than {_utc(cutoff)}")
            return
        day_messages, day_attempts = self.count_days(run, whole)
        count, lower, upper = self._row("run_bounds", run=run)
        item_messages, item_attempts = self._row("run_counts", run=run)
        want = (day_messages + item_messages, day_attempts + item_attempts)
        self._execute("mark_writing", run=run, messages=want[0])
        say(
            self.out,
            f"run {run}: writing {want[0]} messages and their attempts: {len(whole)} days "
            f"whole ({day_messages} messages), {count} messages row by row …",
        )
        try:
            usage = self.write(run, layout, whole, (lower, upper) if count else None, want)
        except PipelineError:
            raise
        except Exception as e:
            # Spark's own failures (an executor lost, a JDBC error) as one line, too.
            raise PipelineError(
                f"run {run}: writing the Parquet failed ({reason(e)}); nothing was deleted, "
                "the next run writes it again"
            ) from None
        messages, attempts = want
        marked = self._execute(
            "mark_written",
            run=run,
            messages=messages,
            attempts=attempts,
            files=usage.files,
            bytes=usage.bytes,
        )
        if marked != 1:
            raise PipelineError(f"run {run} is no longer being written; nothing was deleted")
        say(self.out, f"run {run}: committed {layout.messages(run)} and {layout.attempts(run)}")
        dropped = self.drop_days(run)
        deleted = self.delete(run, item_messages)
        say(
            self.out,
            f"archived {messages} messages and {attempts} attempts finished before "
            f"{_utc(cutoff)}: {usage.files} Parquet files, {usage.bytes} bytes under "
            f"{layout.root} (run {run}; {dropped} days dropped whole, {deleted.messages} "
            f"messages deleted from PostgreSQL in {deleted.batches} "
            f"batch{'' if deleted.batches == 1 else 'es'})",
        )


def _union(a: DataFrame, b: DataFrame) -> DataFrame:
    return a.unionByName(b)


def _days(options: argparse.Namespace) -> float:
    days: float = DEFAULT_OLDER_THAN_DAYS if options.older_than is None else options.older_than
    problem = days_problem(days)
    if problem:
        raise PipelineError(f"--older-than {days!r}: {problem}")
    return days


def validate(options: argparse.Namespace) -> None:
    """What can be checked before Spark starts (the command line checks the rest; the
    output's file system needs Spark's Hadoop)."""
    _days(options)
    if not options.output.strip():
        raise PipelineError("--output is empty: name the archive's folder")


def run(spark: SparkSession, database: Database, options: argparse.Namespace, out: Output) -> int:
    """Finish what killed runs left, then archive what is finished and old enough."""
    days = _days(options)
    fs = HadoopFS(spark)
    layout = check_output(fs, options.output)
    # Parquet's standard timestamps (not Spark's legacy INT96): any reader takes them.
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    with database.connect(autocommit=True, application_name="pgmb archive") as conn:
        say(out, f"archive: {database.describe()} to {layout.root}")
        archiver = _Archiver(spark, fs, database, conn, options, out)
        archiver.lock()
        archiver.finish_leftovers()
        archiver.archive(layout, days)
    return 0
