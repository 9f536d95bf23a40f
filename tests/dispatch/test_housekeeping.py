"""The external dispatcher's housekeeping: once it has drained work, it rebuilds the
indexes a backlog left large (pgmb.housekeeping), beside its deliveries, never instead."""

from __future__ import annotations

import asyncio
import signal
import threading

import psycopg

import pgmb
from pgmb.db.conninfo import conninfo_from_django
from pgmb.dispatch.housekeeper import Housekeeper
from pgmb.models import Attempt
from tests.indexes import SMALL, drained_backlog, index_sizes
from tests.waiting import wait_until


def _housekeeping_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "housekeeping" in r.getMessage()]


def _large(sizes: dict[str, int]) -> dict[str, int]:
    """The indexes the backlog made large (delivering a few changes the others' sizes)."""
    return {name: size for name, size in sizes.items() if size > SMALL.min_index_bytes}


def test_a_dispatcher_that_drained_its_work_rebuilds_the_indexes(
    dispatch, recording_server, make_worker, make_queue, caplog
):
    make_queue("order.#", worker=make_worker(endpoint=recording_server.url()))
    before = drained_backlog()
    pgmb.send_batch(("order.created", n) for n in range(3))

    with caplog.at_level("INFO", logger="pgmb.dispatch"):
        stats = dispatch(housekeeping_interval=3600, housekeeping_thresholds=SMALL)

    assert stats.delivered == 3 and len(recording_server.requests) == 3
    after = index_sizes()
    assert after["pgmb_delivery_pkey"] < SMALL.min_index_bytes < before["pgmb_delivery_pkey"]
    assert after["pgmb_delivery_due"] < SMALL.min_index_bytes < before["pgmb_delivery_due"]
    [line] = _housekeeping_lines(caplog)
    assert "reindexed pgmb_delivery_pkey" in line and "reindexed pgmb_delivery_due" in line


def test_with_an_interval_of_0_the_dispatcher_leaves_the_indexes(
    dispatch, recording_server, make_worker, make_queue, caplog
):
    make_queue("order.#", worker=make_worker(endpoint=recording_server.url()))
    before = drained_backlog()
    pgmb.send_batch(("order.created", n) for n in range(3))

    with caplog.at_level("DEBUG", logger="pgmb.dispatch"):
        assert dispatch(housekeeping_interval=0, housekeeping_thresholds=SMALL).delivered == 3

    assert _large(index_sizes()) == _large(before)
    assert _housekeeping_lines(caplog) == []


def test_a_failed_housekeeping_is_logged_and_the_dispatcher_goes_on(
    dispatch, recording_server, make_worker, make_queue, caplog
):
    make_queue("order.#", worker=make_worker(endpoint=recording_server.url()))
    before = drained_backlog()
    pgmb.send_batch(("order.created", n) for n in range(3))
    with (
        psycopg.connect(**conninfo_from_django("default")) as blocker,
        caplog.at_level("INFO", logger="pgmb.dispatch"),
    ):
        # REINDEX CONCURRENTLY's first lock, held in a transaction until the dispatcher ends.
        blocker.execute("LOCK TABLE pgmb_delivery IN SHARE UPDATE EXCLUSIVE MODE")
        stats = dispatch(housekeeping_interval=3600, housekeeping_thresholds=SMALL)

    assert stats.delivered == 3
    assert Attempt.objects.filter(outcome="ack").count() == 3
    [line] = _housekeeping_lines(caplog)
    assert "failed pgmb_delivery_" in line and "lock timeout" in line
    assert line.count("failed") == 1  # the first failure ends the run
    assert [r.levelname for r in caplog.records if "housekeeping" in r.getMessage()] == ["WARNING"]
    assert _large(index_sizes()) == _large(before)


def test_pgmb_dispatch_rebuilds_them_as_it_runs(spawn, recording_server, make_worker, make_queue):
    make_queue("order.#", worker=make_worker(endpoint=recording_server.url()))
    before = drained_backlog()
    proc = spawn(
        "--poll-interval",
        "0.05",
        extra_env={"PGMB_TEST_HOUSEKEEPING_MIN_INDEX_BYTES": str(SMALL.min_index_bytes)},
    )
    pgmb.send_batch(("order.created", n) for n in range(3))

    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")))
    reader.start()

    recording_server.wait_for(3)
    # The log line, not the sizes: stopped between its last rebuild and its report, the
    # dispatcher would cancel the report.
    [line] = wait_until(
        lambda: [line for line in lines if "housekeeping" in line],
        message=lambda: f"the housekeeping's log line (stderr so far: {lines})",
    )
    assert "reindexed pgmb_delivery_pkey" in line and "reindexed pgmb_delivery_due" in line
    pkey = "pgmb_delivery_pkey"
    assert index_sizes()[pkey] < SMALL.min_index_bytes < before[pkey]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    reader.join()
    pgmb.send("order.created", 4)  # and publishing still routes
    assert index_sizes()["pgmb_delivery_pkey"] < before["pgmb_delivery_pkey"]


def test_a_dispatcher_looks_at_most_once_per_interval_and_only_after_work(transactional_db):
    async def looks() -> list[bool]:
        housekeeper = Housekeeper(conninfo_from_django("default"), 0, 3600, SMALL)
        started = []
        for claimed in (0, 5, 5, 9):  # nothing yet; work; no more work; work within the hour
            started.append(housekeeper.start_if_due(claimed))
            await housekeeper.wait()
        return started

    assert asyncio.run(looks()) == [False, True, False, False]


def _vacuums() -> int:
    """Manual vacuums of pgmb_delivery so far (autovacuum's are counted apart)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'pgmb_delivery'"
        )
        return cursor.fetchone()[0]


def test_a_dispatcher_that_drained_enough_claims_vacuums_the_hot_table(
    dispatch, recording_server, make_worker, make_queue
):
    make_queue("order.#", worker=make_worker(endpoint=recording_server.url()))
    pgmb.send_batch(("order.created", n) for n in range(120))
    before = _vacuums()

    stats = dispatch(vacuum_every=40, batch=10, concurrency=4, housekeeping_interval=0)

    assert stats.delivered == 120 and len(recording_server.requests) == 120
    # Drained with 120 claimed: a vacuum, which the run waits for before it exits; the
    # statistics may say so a moment later.
    wait_until(lambda: _vacuums() > before, message="a vacuum of pgmb_delivery")


def test_with_vacuum_every_0_the_dispatcher_leaves_vacuuming_to_autovacuum(
    dispatch, recording_server, make_worker, make_queue, caplog
):
    make_queue("order.#", worker=make_worker(endpoint=recording_server.url()))
    pgmb.send_batch(("order.created", n) for n in range(120))
    before = _vacuums()

    with caplog.at_level("DEBUG", logger="pgmb.dispatch"):
        stats = dispatch(vacuum_every=0, batch=10, concurrency=4, housekeeping_interval=0)

    assert stats.delivered == 120
    assert not [r for r in caplog.records if "vacuum" in r.getMessage()]
    assert _vacuums() == before
