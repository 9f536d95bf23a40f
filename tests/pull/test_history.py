"""A pull queue that keeps no history (keep_history off): its deletes and pops write no
'ack' row, as PGMQ's delete keeps nothing; archives, retries and dead letters are still
recorded (docs/decisions/0063-pull-queues-without-history.md)."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from psycopg import errors

import pgmb
from pgmb.models import Attempt, DeadLetter, Delivery, Queue, Worker
from tests.pull.apis import APIS


def _publish(n: int, key: str = "job.run") -> None:
    for i in range(n):
        pgmb.send(key, {"n": i})


def _outcomes(queue: Queue) -> list[tuple[str, int]]:
    return sorted(Attempt.objects.filter(queue=queue).values_list("outcome", "attempt"))


def _sql(statement: str, params: list) -> tuple:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone()


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_without_history_a_delete_and_a_pop_leave_no_row(api, make_pull_queue):
    queue = make_pull_queue(keep_history=False)
    _publish(4)
    handles = [r[0] for r in api.read(queue.name, 30, 2)]
    assert api.delete(queue.name, handles) == handles
    assert api.delete(queue.name, handles) == []  # settled already: skipped, as with history
    assert [b["n"] for _, b, _ in api.pop(queue.name, 1)] == [2]
    assert _outcomes(queue) == []
    assert Delivery.objects.filter(queue=queue).count() == 1


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_without_history_archives_retries_and_dead_letters_are_recorded(api, make_pull_queue):
    queue = make_pull_queue(keep_history=False, max_retries=1, backoff_base=0, backoff_max=0)
    _publish(3)
    first, second, third = api.read(queue.name, 0, 3)
    assert api.archive(queue.name, [first[0]]) == [first[0]]
    assert api.nack(queue.name, [second], "handler failed") == 1
    # The third, read once, is read a second time, then dead-lettered by the third read.
    assert [ct for _, _, ct in api.read(queue.name, 0, 2)] == [2, 2]
    assert api.delete(queue.name, [second[0]]) == [second[0]]
    assert api.read(queue.name, 30, 1) == []
    assert DeadLetter.objects.get(queue=queue).attempts == 2
    assert _outcomes(queue) == [("archived", 1), ("dead", 2), ("retry", 1)]
    assert third[2] == 1


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_history_turned_off_and_on_applies_to_later_deletes(api, make_pull_queue):
    queue = make_pull_queue()
    _publish(3)
    a, b, c = (r[0] for r in api.read(queue.name, 30, 3))
    assert _sql("SELECT pgmb.set_keep_history(%s, false)", [queue.name]) == (True,)
    assert api.delete(queue.name, [a]) == [a]
    assert _sql("SELECT pgmb.set_keep_history(%s, true)", [queue.name]) == (False,)
    assert api.delete(queue.name, [b, c]) == [b, c]
    assert _outcomes(queue) == [("ack", 1), ("ack", 1)]


def test_create_with_and_without_history(db):
    (off,) = _sql("SELECT pgmb.create('pull_off', 'a.#', 3, NULL, false)", [])
    (on,) = _sql("SELECT pgmb.create('pull_on', 'a.#', 3, NULL)", [])  # 0.1.1's call
    assert Queue.objects.get(pk=off).keep_history is False
    assert Queue.objects.get(pk=on).keep_history is True
    assert Queue.objects.get(pk=off).max_retries == 3


def test_only_a_pull_queue_may_keep_no_history(db):
    worker = Worker.objects.create(name="w", endpoint="http://127.0.0.1:9/", rps=5)

    def refused(statement: str, params: list, error: type, match: str) -> None:
        with pytest.raises(DatabaseError, match=match) as caught, transaction.atomic():
            _sql(statement, params)
        assert isinstance(caught.value.__cause__, error)

    refused(
        "SELECT pgmb.create('push_q', 'a.#', 3, %s, false)",
        [worker.pk],
        errors.InvalidParameterValue,
        "only a pull queue may keep no history",
    )
    push = Queue.objects.create(name="push_q", binding_key="a.#", worker=worker)
    refused(
        "SELECT pgmb.set_keep_history('push_q', false)", [], errors.InvalidParameterValue, "worker"
    )
    refused("SELECT pgmb.set_keep_history('push_q', NULL)", [], errors.NullValueNotAllowed, "NULL")
    refused(
        "SELECT pgmb.set_keep_history('nowhere', false)", [], errors.UndefinedObject, "not exist"
    )
    # Any other writer: the constraint.
    with pytest.raises(IntegrityError, match="pgmb_queue_history_pull_only"), transaction.atomic():
        Queue.objects.filter(pk=push.pk).update(keep_history=False)
    # The admin's form: the model's validation keeps it on for a queue with a worker.
    push.keep_history = False
    push.full_clean()
    assert push.keep_history is True
    push.save()
    assert Queue.objects.get(pk=push.pk).keep_history is True
