"""Housekeeping (pgmb.housekeeping): pgmb_delivery's indexes back to size after a backlog.

Every session here is an autocommit connection of its own (REINDEX CONCURRENTLY refuses a
transaction block, and waits for the open ones): the tests use ``transactional_db``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import psycopg
import pytest

import pgmb
from pgmb import deliveries, housekeeping
from pgmb.db.conninfo import conninfo_from_django
from pgmb.housekeeping import Thresholds
from tests.indexes import BACKLOG, SMALL, drained_backlog, index_sizes, live_rows, publish
from tests.waiting import wait_until


@pytest.fixture
def connect(transactional_db) -> Iterator[Callable[[], psycopg.Connection]]:
    opened: list[psycopg.Connection] = []

    def open_one() -> psycopg.Connection:
        conn = psycopg.connect(**conninfo_from_django("default"), autocommit=True)
        opened.append(conn)
        return conn

    yield open_one
    for conn in opened:
        conn.close()


def test_indexes_left_large_by_a_drained_backlog_are_rebuilt(transactional_db, make_queue):
    make_queue("order.#")
    before = drained_backlog()
    assert before["pgmb_delivery_pkey"] > SMALL.min_index_bytes
    assert before["pgmb_delivery_due"] > SMALL.min_index_bytes

    report = housekeeping.housekeep(thresholds=SMALL)

    after = index_sizes()
    assert report.ran and not report.failed
    rebuilt = {step.index: step for step in report.steps}
    assert {"pgmb_delivery_pkey", "pgmb_delivery_due"} <= set(rebuilt)
    assert all(step.action == "reindexed" for step in report.steps)
    for name, step in rebuilt.items():
        assert step.before == before[name]
        assert step.after == after[name] < SMALL.min_index_bytes < before[name]
    assert set(after) == set(before)  # no copy left behind

    # The rebuilt indexes serve the state machine as before.
    pgmb.send("order.created", {"n": 1})
    [claim] = deliveries.claim()
    assert deliveries.ack([deliveries.Success(claim.delivery_id, 200)]) == 1
    pgmb.send("order.created", {"n": 2})
    [claim] = deliveries.claim()
    assert claim.body == '{"n": 2}'


def test_nothing_is_done_to_indexes_the_live_rows_need(transactional_db, make_queue):
    make_queue("order.#")
    publish(BACKLOG)
    wait_until(lambda: live_rows() >= BACKLOG, message="the statistics to count the backlog")
    before = index_sizes()
    assert before["pgmb_delivery_due"] > SMALL.min_index_bytes

    report = housekeeping.housekeep(thresholds=SMALL)

    assert report.ran and report.steps == () and report.live_rows >= BACKLOG
    assert index_sizes() == before
    assert "no index to rebuild" in report.summary()


def test_small_indexes_are_left_alone_however_empty_the_table(transactional_db, make_queue):
    make_queue("order.#")
    before = drained_backlog(2_000)
    assert max(before.values()) < housekeeping.DEFAULT_MIN_INDEX_BYTES

    assert housekeeping.housekeep(thresholds=Thresholds()).steps == ()
    assert index_sizes() == before


def test_a_dry_run_says_what_it_would_do_and_does_nothing(transactional_db, make_queue):
    make_queue("order.#")
    before = drained_backlog()

    report = housekeeping.housekeep(thresholds=SMALL, dry_run=True)

    assert {step.action for step in report.steps} == {"would reindex"}
    assert "pgmb_delivery_pkey" in {step.index for step in report.steps}
    assert index_sizes() == before


def test_while_another_process_holds_the_lock_nothing_is_done(connect, make_queue):
    make_queue("order.#")
    before = drained_backlog()
    holder = connect()
    holder.execute("SELECT pg_advisory_lock(hashtextextended('pgmb housekeeping', 0))")

    report = housekeeping.housekeep(thresholds=SMALL)

    assert not report.ran and report.steps == ()
    assert "another process" in report.summary()
    assert index_sizes() == before
    holder.execute("SELECT pg_advisory_unlock(hashtextextended('pgmb housekeeping', 0))")
    assert housekeeping.housekeep(thresholds=SMALL).steps  # free again: it runs


def test_of_two_concurrent_callers_only_one_rebuilds(connect, make_queue):
    make_queue("order.#")
    drained_backlog()
    conninfo = conninfo_from_django("default")

    async def both() -> list[housekeeping.Report]:
        return list(
            await asyncio.gather(
                housekeeping.arun(conninfo, SMALL), housekeeping.arun(conninfo, SMALL)
            )
        )

    reports = asyncio.run(both())

    # Either they overlapped (one was refused the lock) or the second found nothing left.
    rebuilt = [step.index for report in reports for step in report.steps]
    assert "pgmb_delivery_pkey" in rebuilt
    assert len(rebuilt) == len(set(rebuilt))
    assert sum(1 for report in reports if report.steps) == 1


def test_leftovers_of_an_interrupted_rebuild_are_dropped(connect, make_queue):
    make_queue("order.#")
    publish(2)  # two deliveries of one queue: a unique index on queue_id cannot be built
    admin = connect()
    for name in ("pgmb_delivery_due_ccnew", "someone_elses_index"):
        with pytest.raises(psycopg.errors.UniqueViolation):
            admin.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {name} ON pgmb_delivery (queue_id)")
    try:
        report = housekeeping.housekeep(thresholds=SMALL)

        assert [(s.index, s.action, s.after) for s in report.steps] == [
            ("pgmb_delivery_due_ccnew", "dropped leftover", 0)
        ]
        names = set(index_sizes())
        assert "pgmb_delivery_due_ccnew" not in names
        assert "someone_elses_index" in names  # invalid, but not a rebuild's: not ours
    finally:
        admin.execute("DROP INDEX IF EXISTS someone_elses_index")


def test_a_failed_rebuild_is_reported_not_raised(connect, make_queue):
    make_queue("order.#")
    before = drained_backlog()
    blocker = connect()
    blocker.execute("BEGIN")
    # REINDEX CONCURRENTLY's first lock; held, it meets the housekeeping's lock_timeout.
    blocker.execute("LOCK TABLE pgmb_delivery IN SHARE UPDATE EXCLUSIVE MODE")

    report = housekeeping.housekeep(thresholds=SMALL)
    blocker.execute("ROLLBACK")

    assert report.ran and len(report.steps) == 1  # the first failure ends the run
    assert report.steps[0].action == "failed"
    assert "lock timeout" in report.failed[0].error
    assert "error=" in report.summary()
    assert index_sizes() == before
    assert housekeeping.housekeep(thresholds=SMALL).failed == []  # the next run succeeds
