"""The archive job: finished messages and their attempts to Parquet, then out of PostgreSQL.

Round trip (what is archived equals what PostgreSQL held, what is not finished stays),
idempotence, crashes at every step that matters (the job killed with SIGKILL at a point
where it waits on a lock the test holds), and bad input refused before anything is done.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import psycopg
import pytest
from django.core.management import CommandError
from django.db import connection
from django.test import override_settings

import pgmb
from pgmb import conf, deliveries
from pgmb import sql as pgmb_sql
from pgmb.db.statements import run as run_statement
from pgmb.deliveries import Success
from pgmb.models import DeadLetter
from pgmb.pipeline import archive as archive_job
from pgmb.pipeline import cli
from tests.waiting import wait_until

from .conftest import MASTER
from .history import (
    STRAY_DAYS,
    assert_exactly_once,
    build_history,
    days_ago,
    id_back,
    message_ids,
    partition_of,
    read_archive,
    snapshot,
)

spark = pytest.mark.spark


def sql(statement: str, params=None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def runs() -> list[tuple]:
    return sql(
        "SELECT id, state, messages, attempts, files, bytes FROM pgmb_archive_run ORDER BY id"
    )


def dsn() -> str:
    s = connection.settings_dict
    return f"host={s['HOST']} port={s['PORT']} user={s['USER']} dbname={s['NAME']}"


def connect() -> psycopg.Connection:
    """A connection of the test's own, outside Django's (it holds locks across the job)."""
    return psycopg.connect(dsn(), password=connection.settings_dict["PASSWORD"] or None)


# --- round trip and idempotence -------------------------------------------------------


@spark
@override_settings(PGMB={"PIPELINE_ARCHIVE_OLDER_THAN_DAYS": 5})
def test_round_trip_archives_finished_messages_and_keeps_the_rest(
    run_pipeline, make_queue, tmp_path, monkeypatch
):
    history = build_history(make_queue)
    before = snapshot()
    out = tmp_path / "archive"
    monkeypatch.setattr(archive_job, "PROGRESS_SECONDS", 0)  # report every batch

    # No --older-than: manage.py takes PGMB['PIPELINE_ARCHIVE_OLDER_THAN_DAYS'] (5 days;
    # the default of 7 would archive nothing of a history 6 days old).
    report = run_pipeline("archive", "--output", str(out), "--batch-size", "2")

    archive = read_archive(out)
    after = snapshot()
    assert set(archive.messages) == {str(m) for m in history.archived}
    assert message_ids() == history.kept
    assert_exactly_once(archive, before, after)
    # Every attempt of an archived message went with it, none of a kept one.
    archived_attempts = {k for k, v in before[1].items() if uuid.UUID(v[0]) in history.archived}
    assert set(archive.attempts) == archived_attempts
    assert set(after[1]) == set(before[1]) - archived_attempts
    assert len(archived_attempts) == 8  # 2 acks; 2 fails, 2 acks; a dead one; an ack on gone
    # Layout: messages by run and day, attempts by run, day and queue (null: deleted).
    [(run, state, n_messages, n_attempts, files, size)] = runs()
    assert (state, n_messages, n_attempts) == ("done", 5, 8)
    assert {p[0] for p in archive.message_partitions} == {run}
    assert {p[2] for p in archive.attempt_partitions} == {"orders", "audit", "mail", None}
    assert (out / "messages" / f"run={run}" / "_SUCCESS").exists()
    assert not list((out / "_staging").iterdir())
    parquet = [p for p in out.rglob("*.parquet")]
    assert files == len(parquet) and size == sum(p.stat().st_size for p in parquet)
    assert (
        "archived 5 messages and 8 attempts finished before" in report
        and f"{files} Parquet files, {size} bytes under file:{out} (run {run}" in report
        and "deleted from PostgreSQL in 3 batches)" in report
    ), report
    progress = [line for line in report.splitlines() if "claimed so far" in line]
    assert progress == [f"run {run}: {n} messages claimed so far …" for n in (2, 4, 5)]
    assert f"run {run}: 4 of 5 messages deleted so far …" in report

    again = run_pipeline("archive", "--output", str(out), "--older-than", "5")

    assert "nothing to archive" in again
    assert sorted(out.rglob("*.parquet")) == sorted(parquet)
    assert message_ids() == history.kept
    assert [r[1:3] for r in runs()] == [("done", 5), ("done", 0)]


@spark
def test_older_than_0_archives_every_message_finished_up_to_now(run_pipeline, make_queue, tmp_path):
    history = build_history(make_queue)
    out = tmp_path / "archive"

    report = run_pipeline("archive", "--output", str(out), "--older-than", "0")

    archived = {uuid.UUID(m) for m in read_archive(out).messages}
    # The old finished ones, and the one whose last attempt was just now (a 7-day or 5-day
    # cutoff keeps it); the dead letter and the live delivery stay.
    assert history.archived < archived
    assert archived.isdisjoint(message_ids())
    assert message_ids() < history.kept
    [(_, state, n_messages, *_)] = runs()
    assert (state, n_messages) == ("done", len(archived))
    assert f"archived {len(archived)} messages" in report


@spark
def test_the_stats_job_counts_the_archive_as_it_counted_postgresql(
    run_pipeline, make_queue, tmp_path
):
    build_history(make_queue)
    out = tmp_path / "archive"
    run_pipeline("stats")
    figures = statistics()

    run_pipeline("archive", "--output", str(out), "--older-than", "5")
    run_pipeline("stats", "--include-archive", str(out))

    assert len(figures) > 3 and statistics() == figures


def statistics() -> list[tuple]:
    return sql(
        "SELECT hour, queue_name, worker_name, attempts, delivered, failed, retried, "
        "dead_lettered, expired, attempts_per_message, latency_p50_ms, latency_p95_ms, "
        "latency_p99_ms, top_errors::text FROM pgmb_statistics ORDER BY 1, 2, 3"
    )


# --- crashes ----------------------------------------------------------------------------

#: Seconds a job started as a process may take to reach the point a test waits for: a
#: JVM and a Spark session start first, slowly on a busy machine.
JOB_DEADLINE = 600.0


@dataclass
class Job:
    """An archive job running as a process: ``python -m pgmb.pipeline archive …``."""

    process: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text()


@pytest.fixture
def spawn_archive(transactional_db, tmp_path) -> Iterator[Callable[..., Job]]:
    """Start archive jobs on the test database, each a process group of its own (the
    Python driver and its JVM are killed together); kill what is left at the end."""
    started: list[Job] = []

    def start(*args: str) -> Job:
        log = tmp_path / f"job-{len(started)}.log"
        env = {**os.environ, "PYTHONPATH": os.getcwd()}
        env["PGPASSWORD"] = connection.settings_dict["PASSWORD"] or ""
        command = [sys.executable, "-m", "pgmb.pipeline", "archive"]
        with log.open("w") as out:
            process = subprocess.Popen(
                [*command, "--dsn", dsn(), "--master", MASTER, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        started.append(Job(process, log))
        return started[-1]

    yield start
    for job in started:
        if job.process.poll() is None:
            os.killpg(job.process.pid, signal.SIGKILL)
            job.process.wait()


def blocked_by(locker: psycopg.Connection) -> list[int]:
    """Backends waiting for a lock that ``locker`` holds. Asked on another connection: a
    transaction sees pg_stat_activity as it was at its first look."""
    return [
        pid
        for (pid,) in sql(
            "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
            [locker.info.backend_pid],
        )
    ]


def kill_when_blocked(
    job: Job, locker: psycopg.Connection, meanwhile: Callable[[], object] = list
) -> None:
    """Wait until the job waits on ``locker``'s lock, call ``meanwhile``, then crash the job:
    SIGKILL to the driver and its JVM, and its database sessions end with it (a killed
    client's statement that waits on a lock would otherwise run on once the lock is free).
    Then free the lock."""

    def waiting() -> list[int]:
        assert job.process.poll() is None, f"the job ended first:\n{job.output()}"
        return blocked_by(locker)

    pids = wait_until(waiting, JOB_DEADLINE, "the archive job to wait on the test's lock")
    meanwhile()
    os.killpg(job.process.pid, signal.SIGKILL)
    job.process.wait()
    for pid in pids:
        locker.execute("SELECT pg_terminate_backend(%s, 60000)", [pid])
    locker.rollback()


@contextmanager
def locked(statement: str, params) -> Iterator[psycopg.Connection]:
    with connect() as locker:
        assert locker.execute(statement, params).fetchall(), "nothing to lock"
        yield locker


def publish_old_unrouted() -> uuid.UUID:
    """A finished message (routed nowhere) as old as the history, published now."""
    message_id = pgmb.send("nobody.new", {"late": True}, message_id=id_back(STRAY_DAYS))
    sql(
        "UPDATE pgmb_message SET created_at = created_at - interval '6 days' WHERE id = %s",
        [message_id],
    )
    return message_id


def first_folders(out: Path, run: int) -> list[Path]:
    return [out / "messages" / f"run={run}", out / "attempts" / f"run={run}"]


@spark
def test_killed_after_the_parquet_is_committed_but_before_it_is_recorded(
    run_pipeline, spawn_archive, make_queue, tmp_path
):
    history = build_history(make_queue)
    before = snapshot()
    out = tmp_path / "archive"
    job = spawn_archive("--output", str(out), "--older-than", "5", "--batch-size", "2")

    # Once the run has claimed its messages, hold its row: recording it as written waits.
    wait_until(lambda: runs() and runs()[0][1] == "writing", JOB_DEADLINE, "the run to claim")
    [(run, *_)] = runs()
    with locked("SELECT 1 FROM pgmb_archive_run WHERE id = %s FOR UPDATE", [run]) as locker:
        kill_when_blocked(job, locker)

    # Killed with its Parquet in place and nothing recorded or deleted.
    assert all((folder / "_SUCCESS").exists() for folder in first_folders(out, run))
    assert runs()[0][:2] == (run, "writing")
    assert snapshot() == before

    report = run_pipeline("archive", "--output", str(out), "--older-than", "5")

    assert f"run {run} stopped before its Parquet was committed (writing)" in report
    assert not any(folder.exists() for folder in first_folders(out, run))
    assert [r[:2] for r in runs()] == [(run, "discarded"), (run + 1, "done")]
    archive = read_archive(out)
    assert set(archive.messages) == {str(m) for m in history.archived}
    assert message_ids() == history.kept
    assert_exactly_once(archive, before, snapshot())


@spark
def test_killed_between_the_write_and_the_first_delete(
    run_pipeline, spawn_archive, make_queue, tmp_path
):
    history = build_history(make_queue)
    first = min(history.archived)  # the first message the first batch deletes
    before = snapshot()
    out = tmp_path / "archive"

    newcomers: list[uuid.UUID] = []
    with locked("SELECT 1 FROM pgmb_message WHERE id = %s FOR UPDATE", [first]) as locker:
        job = spawn_archive("--output", str(out), "--older-than", "5", "--batch-size", "2")
        # Published while the job runs, as old and finished as the rest: not its to delete.
        kill_when_blocked(job, locker, lambda: newcomers.append(publish_old_unrouted()))

    [(run, state, *_)] = runs()
    assert state == "written"
    assert message_ids() == history.archived | history.kept | set(newcomers)
    before = snapshot()  # nothing was deleted: all of the history, and the newcomer

    report = run_pipeline("archive", "--output", str(out), "--older-than", "5")

    assert f"run {run} stopped after its Parquet was committed" in report
    assert f"run {run}: deleted the 5 messages and 8 attempts it had left" in report
    assert [r[:3] for r in runs()] == [(run, "done", 5), (run + 1, "done", 1)]
    archive = read_archive(out)
    assert set(archive.messages) == {str(m) for m in history.archived | set(newcomers)}
    assert message_ids() == history.kept
    assert_exactly_once(archive, before, snapshot())


@spark
def test_killed_in_the_middle_of_the_deletes(run_pipeline, spawn_archive, make_queue, tmp_path):
    history = build_history(make_queue)
    order = sorted(history.archived)  # the order of the deletes, two by two
    before = snapshot()
    out = tmp_path / "archive"

    with locked("SELECT 1 FROM pgmb_message WHERE id = %s FOR UPDATE", [order[2]]) as locker:
        job = spawn_archive("--output", str(out), "--older-than", "5", "--batch-size", "2")
        kill_when_blocked(job, locker)

    # The first batch is gone, the second was rolled back with the job's session.
    [(run, state, *_)] = runs()
    assert state == "written"
    assert message_ids() == set(order[2:]) | history.kept

    report = run_pipeline("archive", "--output", str(out), "--older-than", "5")

    assert f"run {run}: deleted the 3 messages" in report
    archive = read_archive(out)
    assert set(archive.messages) == {str(m) for m in history.archived}
    assert message_ids() == history.kept
    assert_exactly_once(archive, before, snapshot())


# --- bad input: one line, nothing done --------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["--older-than", "-2"],
            "argument --older-than: must be a number of days, 0 or more: '-2'",
        ),
        (
            ["--older-than", "nan"],
            "argument --older-than: must be a number of days, 0 or more: 'nan'",
        ),
        (
            ["--older-than", "inf"],
            "argument --older-than: must be a number of days, 0 or more: 'inf'",
        ),
        (["--older-than", "1e9"], "argument --older-than: must be at most 100000 days: '1e9'"),
        (["--older-than", "week"], "argument --older-than: not a number of days: 'week'"),
        (["--batch-size", "0"], "argument --batch-size: must be at least 1: 0"),
        ([], "the following arguments are required: --output"),
    ],
)
def test_bad_numbers_and_a_missing_output_are_refused_before_anything_starts(
    args, error, capsys, tmp_path
):
    output = [] if not args else ["--output", str(tmp_path / "archive")]
    with pytest.raises(SystemExit) as exit:
        cli.main(["archive", *output, *args])
    assert exit.value.code == 2
    assert (
        capsys.readouterr().err.strip().splitlines()[-1] == f"pgmb.pipeline archive: error: {error}"
    )
    assert not (tmp_path / "archive").exists()


def test_an_empty_output_is_refused_before_spark_starts(capsys):
    assert cli.main(["archive", "--output", " ", "--dsn", "host=127.0.0.1 port=1"]) == 2
    assert capsys.readouterr().err == (
        "pgmb.pipeline archive: error: --output is empty: name the archive's folder\n"
    )


def foreign_folder(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    return str(tmp_path / "home"), f"file:{tmp_path}/home is not a pgmb archive: it holds notes.txt"


def a_file(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "archive").write_text("not a folder")
    return str(tmp_path / "archive"), f"file:{tmp_path}/archive is a file, not a folder"


def under_a_file(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "file").write_text("not a folder")
    return str(tmp_path / "file" / "archive"), "cannot create"


def unknown_scheme(tmp_path: Path) -> tuple[str, str]:
    return "nosuchfs://bucket/archive", 'No FileSystem for scheme "nosuchfs"'


@spark
@pytest.mark.parametrize("output", [foreign_folder, a_file, under_a_file, unknown_scheme])
def test_an_unusable_output_is_refused_with_the_database_untouched(
    output, run_pipeline, make_queue, tmp_path
):
    history = build_history(make_queue)
    before = snapshot()
    path, error = output(tmp_path)
    files = sorted(tmp_path.rglob("*"))

    with pytest.raises(CommandError) as failed:
        run_pipeline("archive", "--output", path, "--older-than", "5")

    assert failed.value.returncode == 2
    message = str(failed.value)
    assert message.startswith(f"--output {path}: ") and error in message, message
    assert "\n" not in message
    assert runs() == [] and snapshot() == before and message_ids() >= history.archived
    assert sorted(tmp_path.rglob("*")) == files


@spark
def test_one_archive_job_at_a_time(run_pipeline, make_queue, tmp_path):
    history = build_history(make_queue)
    with connect() as other:
        assert other.execute(
            "SELECT pg_try_advisory_lock(pgmb.archive_lock_key('job'))"
        ).fetchone()[0]
        with pytest.raises(CommandError, match="another archive job is running on "):
            run_pipeline("archive", "--output", str(tmp_path / "a"), "--older-than", "5")
    assert runs() == [] and message_ids() >= history.archived
    assert not (tmp_path / "a" / "messages").exists()


def test_the_setting_must_be_a_number_of_days_0_or_more():
    assert conf.errors({"PIPELINE_ARCHIVE_OLDER_THAN_DAYS": 1e9}) == [
        "PGMB['PIPELINE_ARCHIVE_OLDER_THAN_DAYS'] must be at most 100000 days"
    ]
    assert conf.errors({"PIPELINE_ARCHIVE_OLDER_THAN_DAYS": 0}) == []
    assert conf.errors({"PIPELINE_ARCHIVE_OLDER_THAN_DAYS": "7"})
    assert conf.errors({"PIPELINE_ARCHIVE_OLDER_THAN_DAYS": 0.5}) == []
    assert conf.Settings().PIPELINE_ARCHIVE_OLDER_THAN_DAYS == 7


# --- replay and claimed messages --------------------------------------------------------


def test_a_message_claimed_by_an_archive_run_is_not_replayed(make_queue):
    make_queue("order.*", name="orders")
    claimed = pgmb.send("order.created", {"n": 1})
    free = pgmb.send("order.created", {"n": 2})
    deliveries.ack([Success(c.delivery_id, 200) for c in deliveries.claim(None, 10)])
    [(run,)] = sql(
        "INSERT INTO pgmb_archive_run (output, cutoff, state) "
        "VALUES ('file:/tmp/a', now(), 'writing') RETURNING id"
    )
    sql("INSERT INTO pgmb_archive_item (run_id, message_id) VALUES (%s, %s)", [run, claimed])

    assert deliveries.replay([claimed, free]) == 1
    assert sql("SELECT message_id FROM pgmb_delivery") == [(free,)]


# --- whole days ---------------------------------------------------------------------------

#: Ages of the days of history the day tests make (their partitions), older than the
#: cutoffs the tests use and than the default partition's ids (STRAY_DAYS).
DAY_AGES = (12, 11, 10)


def archive_tables() -> list[str]:
    """Day tables a run detached and has not dropped."""
    return [
        t
        for (t,) in sql(
            "SELECT relname::text FROM pg_class WHERE relname ~ '^pgmb_archive_[0-9]+_' ORDER BY 1"
        )
    ]


def partitions_of(days: list[date]) -> set[date]:
    return {d for (d,) in sql("SELECT day FROM pgmb.history_days()") if d in days}


def day_part(day: date) -> str:
    return f"pgmb_message_p{day:%Y%m%d}"


@spark
def test_whole_days_and_the_default_partition_are_archived_exactly_once(
    run_pipeline, make_queue, tmp_path
):
    days = days_ago(*DAY_AGES)
    history = build_history(make_queue, days=days, extra_unrouted=5)
    where = {m: partition_of(m) for m in history.archived | history.kept}
    assert {day_part(d) for d in days} | {"pgmb_message_default"} <= set(where.values())
    from_days = {m for m in history.archived if where[m] != "pgmb_message_default"}
    old_kept = {m for m in history.kept if where[m] in {day_part(d) for d in days}}
    assert from_days and old_kept  # the days hold both
    before = snapshot()
    out = tmp_path / "archive"

    report = run_pipeline("archive", "--output", str(out), "--older-than", "5", "--batch-size", "2")

    archive = read_archive(out)
    after = snapshot()
    assert set(archive.messages) == {str(m) for m in history.archived}
    assert message_ids() == history.kept
    assert_exactly_once(archive, before, after)
    archived_attempts = {k for k, v in before[1].items() if uuid.UUID(v[0]) in history.archived}
    assert set(archive.attempts) == archived_attempts
    assert set(after[1]) == set(before[1]) - archived_attempts
    # The kept messages of the days are in the default partitions now, with their attempts.
    assert {partition_of(m) for m in old_kept} == {"pgmb_message_default"}
    [(stored,)] = sql(
        "SELECT count(*) FROM pgmb_attempt_default WHERE message_id = ANY(%s)", [list(old_kept)]
    )
    assert stored == sum(1 for v in before[1].values() if uuid.UUID(v[0]) in old_kept) > 0
    # The days are gone, dropped with no detached table left.
    assert partitions_of(days) == set() and archive_tables() == []
    [(run, state, n_messages, n_attempts, *_)] = runs()
    assert (state, n_messages, n_attempts) == ("done", len(history.archived), len(archive.attempts))
    recorded = sql(
        "SELECT day, kept, messages, dropped_at IS NOT NULL FROM pgmb_archive_day"
        " WHERE run_id = %s ORDER BY day",
        [run],
    )
    assert [r[0] for r in recorded] == days and all(r[3] for r in recorded)
    assert sum(r[1] for r in recorded) == len(old_kept)
    assert sum(r[2] for r in recorded) == len(from_days)
    rows = len(history.archived) - len(from_days)
    assert (
        f"{len(days)} days whole ({len(from_days)} messages), {rows} messages row by row" in report
    ), report
    assert f"(run {run}; 3 days dropped whole, {rows} messages deleted from PostgreSQL" in report

    # An archived message of a day is in no table pgmb.replay reads.
    assert deliveries.replay(sorted(from_days)) == 0

    # The kept ones go on: the dead letter requeued, every delivery acked; the next run
    # (everything finished up to now) archives them, and nothing twice.
    [dead] = DeadLetter.objects.all()
    assert run_statement(deliveries.requeue_call(dead.id)) == 1
    claims = deliveries.claim(None, 100)
    assert dead.message_id in {uuid.UUID(str(c.message_id)) for c in claims}
    assert deliveries.ack([Success(c.delivery_id, 200, 1.0) for c in claims]) == len(claims)

    again = run_pipeline("archive", "--output", str(out), "--older-than", "0")

    second = read_archive(out)
    ids = [row[0] for row in second.message_rows]
    assert len(ids) == len(set(ids)), "a message archived twice"
    # All but today's message, whose day has not ended.
    [today] = days_ago(0)
    todays = {m for m in history.kept if where[m] == day_part(today)}
    assert todays
    assert {uuid.UUID(m) for m in second.messages} == history.archived | history.kept - todays
    assert message_ids() == todays
    assert "0 days whole" in again


@spark
def test_a_day_whose_tables_are_busy_is_left_for_the_next_run(run_pipeline, make_queue, tmp_path):
    days = days_ago(*DAY_AGES)
    history = build_history(make_queue, days=days)
    busy = days[1]
    held = {m for m in history.archived if partition_of(m) == day_part(busy)}
    assert held
    before = snapshot()
    out = tmp_path / "archive"

    with connect() as locker:
        locker.execute(f"LOCK TABLE {day_part(busy)} IN ACCESS SHARE MODE")
        report = run_pipeline("archive", "--output", str(out), "--older-than", "5")

    assert f"day {busy} left for the next run: its tables were busy" in report
    assert set(read_archive(out).messages) == {str(m) for m in history.archived - held}
    assert message_ids() == history.kept | held
    assert {partition_of(m) for m in held} == {day_part(busy)}
    assert partitions_of(days) == {busy}

    again = run_pipeline("archive", "--output", str(out), "--older-than", "5")

    assert "1 days whole" in again
    archive = read_archive(out)
    assert set(archive.messages) == {str(m) for m in history.archived}
    assert message_ids() == history.kept
    assert_exactly_once(archive, before, snapshot())
    assert partitions_of(days) == set() and archive_tables() == []


def archive_sql(name: str) -> str:
    return pgmb_sql.query("archive.sql", name)


def hold_a_claim(locker: psycopg.Connection, message_id: uuid.UUID) -> None:
    """An uncommitted claim of ``message_id``: a run's claim of it waits on its unique key."""
    [(run,)] = locker.execute(
        "INSERT INTO pgmb_archive_run (output, cutoff) VALUES ('file:/nowhere', now()) RETURNING id"
    ).fetchall()
    locker.execute(
        "INSERT INTO pgmb_archive_item (run_id, message_id) VALUES (%s, %s)", [run, message_id]
    )


@spark
@pytest.mark.parametrize("step", ["claiming", "written", "dropping", "finished by 0.1.1"])
def test_killed_at_each_step_of_the_day_path(
    step, run_pipeline, spawn_archive, make_queue, tmp_path
):
    days = days_ago(*DAY_AGES)
    history = build_history(make_queue, days=days, extra_unrouted=3)
    rows = sorted(m for m in history.archived if partition_of(m) == "pgmb_message_default")
    before = snapshot()
    out = tmp_path / "archive"
    args = ("--output", str(out), "--older-than", "5", "--batch-size", "2")

    if step == "claiming":
        # The days taken, the row by row claims waiting on the test's claim of the first.
        with connect() as locker:
            hold_a_claim(locker, rows[0])
            job = spawn_archive(*args)
            kill_when_blocked(job, locker)
        [(run, state, *_)] = runs()
    else:
        job = spawn_archive(*args)
        wait_until(lambda: runs() and runs()[0][1] == "writing", JOB_DEADLINE, "the run to claim")
        [(run, *_)] = runs()
        if step == "written":
            # Its Parquet committed, recording it as written waits.
            statement, params = "SELECT 1 FROM pgmb_archive_run WHERE id = %s FOR UPDATE", [run]
        else:
            # Recorded as written, the first day dropped; dropping the second waits.
            [(table,)] = sql(
                "SELECT message_table FROM pgmb_archive_day WHERE run_id = %s AND day = %s",
                [run, days[1]],
            )
            statement, params = f"SELECT 1 FROM {table} LIMIT 1 FOR UPDATE", None
        with locked(statement, params) as locker:
            kill_when_blocked(job, locker)
        [(_, state, *_)] = runs()

    # Killed with the days detached: their messages are in no table of the history.
    dropping = step in ("dropping", "finished by 0.1.1")
    assert state == {"claiming": "claiming", "written": "writing"}.get(step, "written")
    assert partitions_of(days) == set()
    left = sql("SELECT day FROM pgmb_archive_day WHERE run_id = %s AND dropped_at IS NULL", [run])
    assert [d for (d,) in left] == (days[1:] if dropping else days)
    if step == "finished by 0.1.1":
        # As 0.1.1's job finishes a written run, knowing no days: its rows deleted, done.
        while sql(archive_sql("delete_batch"), {"run": run, "limit": 2})[0][0]:
            pass
        sql(archive_sql("mark_done"), {"run": run})

    report = run_pipeline("archive", *args[:4])

    if dropping:
        assert f"run {run}: dropped the tables of 2 days it had left" in report
        assert [r[:2] for r in runs()] == [(run, "done"), (run + 1, "done")]
    else:
        assert "takes over 3 days a stopped run had detached" in report
        assert runs()[0][:2] == (run, "discarded")
        assert runs()[-1][1] == "done"
        assert not any(folder.exists() for folder in first_folders(out, run))
    archive = read_archive(out)
    assert set(archive.messages) == {str(m) for m in history.archived}
    assert message_ids() == history.kept
    assert_exactly_once(archive, before, snapshot())
    assert archive_tables() == []
