"""A worker's timeout stays shorter than the lease of each of its queues under concurrent
writers (docs/decisions/0056-timeout-and-lease-take-turns.md).

Issue 26: the worker's trigger checked the queues' leases and the queue's trigger checked
the worker's timeout, each in its own snapshot; raising the timeout while lowering a lease,
in two transactions, both committed (50 s / 20 s). Two real sessions, ordered by the lock
one waits for (pg_stat_activity), never by the clock.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from pgmb.db.conninfo import conninfo_from_django
from pgmb.models import Queue, Worker
from tests.waiting import DEADLINE, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

RAISE_TIMEOUT = "UPDATE pgmb_worker SET timeout = 50 WHERE id = %s"
LOWER_LEASE = "UPDATE pgmb_queue SET lease_seconds = 20 WHERE id = %s"


def _interleave(first: tuple[str, object], second: tuple[str, object]) -> BaseException | None:
    """Run ``first`` in an open transaction, then ``second`` in another session until it
    waits for a lock, then commit the first; the second's error (or None)."""
    params = conninfo_from_django("default")
    outcome: list[BaseException | None] = []
    with (
        psycopg.connect(**params) as one,
        psycopg.connect(**params, autocommit=True) as two,
        psycopg.connect(**params, autocommit=True) as watcher,
    ):
        one.execute(first[0], (first[1],))
        pid = two.info.backend_pid

        def run_second() -> None:
            try:
                two.execute(second[0], (second[1],))
                outcome.append(None)
            except psycopg.Error as exc:
                outcome.append(exc)

        thread = threading.Thread(target=run_second)
        thread.start()

        # Waiting for the first (or, without the lock, already done: 0.1.0 let it commit).
        def waiting() -> bool:
            if not thread.is_alive():
                return True
            (locked,) = watcher.execute(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
            return bool(locked)

        wait_until(waiting, message="the second writer to wait for the first")
        one.commit()
        thread.join(DEADLINE)
    [error] = outcome
    return error


@pytest.fixture
def pair(make_worker, make_queue) -> tuple[Worker, Queue]:
    worker = make_worker(timeout=10)
    return worker, make_queue("job.#", worker=worker, lease_seconds=60)


def _stored(worker: Worker, queue: Queue) -> tuple[float, float]:
    worker.refresh_from_db()
    queue.refresh_from_db()
    return worker.timeout, queue.lease_seconds


def test_a_lease_lowered_while_the_timeout_is_raised_is_refused(pair):
    worker, queue = pair
    error = _interleave((RAISE_TIMEOUT, worker.id), (LOWER_LEASE, queue.id))
    assert isinstance(error, psycopg.errors.InvalidParameterValue), error
    assert "must be longer than the timeout of worker" in str(error)
    assert _stored(worker, queue) == (50, 60)


def test_a_timeout_raised_while_the_lease_is_lowered_is_refused(pair):
    worker, queue = pair
    error = _interleave((LOWER_LEASE, queue.id), (RAISE_TIMEOUT, worker.id))
    assert isinstance(error, psycopg.errors.InvalidParameterValue), error
    assert "must be shorter than the lease of queue" in str(error)
    assert _stored(worker, queue) == (10, 20)


def test_changes_that_keep_the_rule_both_commit(pair):
    worker, queue = pair
    error = _interleave(
        ("UPDATE pgmb_worker SET timeout = 15 WHERE id = %s", worker.id),
        ("UPDATE pgmb_queue SET lease_seconds = 20 WHERE id = %s", queue.id),
    )
    assert error is None
    assert _stored(worker, queue) == (15, 20)
