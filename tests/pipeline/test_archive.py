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
from pathlib import Path

import psycopg
import pytest
from django.core.management import CommandError
from django.db import connection
from django.test import override_settings

import pgmb
from pgmb import conf, deliveries
from pgmb.deliveries import Success
from pgmb.pipeline import archive as archive_job
from pgmb.pipeline import cli
from tests.waiting import wait_until

from .conftest import MASTER
from .history import (
    assert_exactly_once,
    build_history,
    message_ids,
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
    message_id = pgmb.send("nobody.new", {"late": True})
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
