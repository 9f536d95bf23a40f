"""A worker's timeout is shorter than the lease of every queue it delivers for: one table
of cases, one verdict from Python (pgmb.models.timeout_within_lease, the models'
validation, the admin's forms) and from the database (pgmb.timeout_within_lease, the
worker_timeout and queue_prepare triggers, whatever writes the row)
(docs/decisions/0040-a-request-ends-within-its-lease.md)."""

from __future__ import annotations

import itertools
import math

import psycopg
import pytest
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.utils import DatabaseError

from pgmb.models import Queue, Worker, timeout_within_lease

pytestmark = pytest.mark.django_db

_names = itertools.count(1)

LONGEST_LEASE = 2592000.0

# (worker's timeout, queue's lease, accepted?)
CASES: list[tuple[float, float, bool]] = [
    (10.0, 60.0, True),
    (59.999, 60.0, True),
    (60.0, 60.0, False),
    (61.0, 60.0, False),
    (0.001, 0.002, True),
    (0.002, 0.002, False),
    (2591999.0, LONGEST_LEASE, True),
    (LONGEST_LEASE, LONGEST_LEASE, False),
    (1e300, 60.0, False),
    (math.inf, LONGEST_LEASE, False),
    (math.nan, LONGEST_LEASE, False),
]
IDS = [f"{t:g} in {lease:g}" for t, lease, _ in CASES]


def _worker(timeout: float) -> Worker:
    return Worker.objects.create(
        name=f"rule_{next(_names)}", endpoint="http://127.0.0.1:9/", timeout=timeout
    )


def _queue(lease: float, worker: Worker | None = None, name: str = "") -> Queue:
    return Queue.objects.create(
        name=name or f"rule_{next(_names)}", binding_key="#", worker=worker, lease_seconds=lease
    )


def _python(model: Worker | Queue, field: str) -> bool:
    try:
        model.full_clean()
    except ValidationError as exc:
        assert list(exc.message_dict) == [field], exc.message_dict
        return False
    return True


def _sql(statement: str, *params: object) -> tuple[bool, str]:
    """Run a plain SQL write in a savepoint: (accepted, the refusal's message)."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement, params)
    except DatabaseError as exc:
        cause = exc.__cause__
        assert isinstance(cause, psycopg.Error) and cause.sqlstate == "22023", exc
        return False, str(cause)
    return True, ""


@pytest.mark.parametrize(("timeout", "lease", "accepted"), CASES, ids=IDS)
def test_the_rule_is_the_same_in_python_and_sql(timeout, lease, accepted):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgmb.timeout_within_lease(%s, %s)", (timeout, lease))
        [(in_sql,)] = cursor.fetchall()
    assert (timeout_within_lease(timeout, lease), in_sql) == (accepted, accepted)


@pytest.mark.parametrize(("timeout", "lease", "accepted"), CASES, ids=IDS)
def test_a_worker_whose_timeout_changes(timeout, lease, accepted):
    worker = _worker(0.0005)
    queue = _queue(lease, worker)
    _queue(LONGEST_LEASE, worker, name="zz_named_after")  # of two equal leases, the first

    worker.timeout = timeout
    assert _python(worker, "timeout") is accepted
    done, refusal = _sql("UPDATE pgmb_worker SET timeout = %s WHERE id = %s", timeout, worker.pk)
    assert done is accepted
    if not accepted:  # names the worker and the queue of the shortest lease
        assert f"for worker '{worker.name}'" in refusal
        assert f"the lease of queue '{queue.name}' ({lease:.15g} s)" in refusal
    worker.refresh_from_db()
    assert worker.timeout == timeout if accepted else worker.timeout == 0.0005


@pytest.mark.parametrize(("timeout", "lease", "accepted"), CASES, ids=IDS)
def test_a_queue_bound_to_a_worker(timeout, lease, accepted):
    worker = _worker(timeout)
    queue = _queue(lease)  # a pull queue, then given the worker

    queue.worker = worker
    assert _python(queue, "lease_seconds") is accepted
    done, refusal = _sql("UPDATE pgmb_queue SET worker_id = %s WHERE id = %s", worker.pk, queue.pk)
    assert done is accepted
    if not accepted:
        assert f"for queue '{queue.name}'" in refusal
        assert f"the timeout of worker '{worker.name}'" in refusal
    done, _ = _sql(
        "INSERT INTO pgmb_queue (name, binding_key, pattern, worker_id, lease_seconds)"
        " VALUES (%s, '#', '', %s, %s)",
        f"rule_{next(_names)}",
        worker.pk,
        lease,
    )
    assert done is accepted


@pytest.mark.parametrize(
    ("timeout", "lease", "accepted"),
    [c for c in CASES if c[0] < LONGEST_LEASE],
    ids=[i for i, c in zip(IDS, CASES, strict=True) if c[0] < LONGEST_LEASE],
)
def test_a_queue_whose_lease_changes(timeout, lease, accepted):
    worker = _worker(timeout)
    queue = _queue(LONGEST_LEASE, worker)

    queue.lease_seconds = lease
    assert _python(queue, "lease_seconds") is accepted
    done, refusal = _sql("UPDATE pgmb_queue SET lease_seconds = %s WHERE id = %s", lease, queue.pk)
    assert done is accepted
    if not accepted:
        assert f"timeout of worker '{worker.name}' ({timeout:.15g} s)" in refusal
    queue.refresh_from_db()
    assert queue.lease_seconds == (lease if accepted else LONGEST_LEASE)


def test_a_queue_stored_before_the_rule_can_still_be_paused():
    worker = _worker(0.5)
    queue = _queue(1.0, worker)
    with connection.cursor() as cursor:  # as a database from before the rule could hold
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute("UPDATE pgmb_worker SET timeout = 5 WHERE id = %s", (worker.pk,))
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")

    assert _sql("UPDATE pgmb_queue SET paused = true WHERE id = %s", queue.pk) == (True, "")
    done, refusal = _sql("UPDATE pgmb_queue SET lease_seconds = 2 WHERE id = %s", queue.pk)
    assert not done and "the timeout of worker" in refusal
