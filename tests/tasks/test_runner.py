"""The Tasks worker's consumer (pgmb.tasks.worker.TaskConsumer) in the test process: one
statement a task on the Django connection, with every outcome recorded as the plain
consumer records it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections
from django_tasks import TaskResultStatus
from django_tasks.signals import task_finished, task_started

from pgmb import pull
from pgmb.models import Attempt, DeadLetter, Delivery, Queue
from pgmb.models import TaskResult as TaskResultRow
from pgmb.publish import send
from pgmb.tasks.executor import record, run, worker_id
from pgmb.tasks.worker import TaskConsumer, ensure_queues
from tests.tasks import jobs


@pytest.fixture
def statements() -> Callable[[], Any]:
    """Records the statements of the test thread's Django connection (the runner's):
    in autocommit each is a transaction of its own."""
    seen: list[str] = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    conn = connections["default"]
    with conn.execute_wrapper(wrapper):
        yield seen


@pytest.fixture
def tasks_queue(transactional_db) -> str:
    [name] = ensure_queues(["default"])
    Queue.objects.filter(name=name).update(max_retries=0, backoff_base=0, backoff_max=0)
    return name


def _consume(queue: str, n: int) -> TaskConsumer:
    consumer = TaskConsumer(queue, vt=30, max_messages=n)
    consumer.run()
    return consumer


def test_a_batch_of_tasks_costs_one_statement_a_task_but_the_first(tasks_queue, statements):
    results = [jobs.add.enqueue(i, 1) for i in range(5)]
    statements.clear()
    consumer = _consume(tasks_queue, 5)
    # The consumer's read starts the first task, on its own connection; each later task's
    # start records the previous task's success; the batch's last success is recorded
    # after it, then the consumer deletes the batch's messages on its own connection. No
    # statement of its own reads the queue's settings.
    assert len(statements) == 4 + 1
    assert all("pgmb.read" not in statement for statement in statements)
    assert consumer.deleted == 5 and consumer.failed == 0
    for i, result in enumerate(results):
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == i + 1
        assert result.finished_at is not None
    assert not Delivery.objects.exists()
    assert Attempt.objects.filter(outcome="ack").count() == 5


def test_a_failure_in_a_batch_is_failed_and_the_others_succeed(tasks_queue):
    first = jobs.add.enqueue(1, 1)
    failing = jobs.explode.enqueue("no")
    last = jobs.add.enqueue(2, 2)
    consumer = _consume(tasks_queue, 3)
    assert consumer.deleted == 2 and consumer.failed == 1
    for result in (first, failing, last):
        result.refresh()
    assert (first.status, last.status) == (TaskResultStatus.SUCCESSFUL,) * 2
    assert failing.status == TaskResultStatus.FAILED
    assert failing.errors[0].exception_class is ValueError
    assert str(DeadLetter.objects.get().message_id) == failing.id
    assert not Delivery.objects.exists()


def test_a_first_message_that_carries_no_task_is_failed_and_the_next_task_runs(tasks_queue):
    """The read starts the task of its first message: a message with no result row (not
    enqueued by the backend) gets no start, fails, and the batch goes on."""
    stray = send("tasks.default", {"task": "tests.tasks.jobs.add", "backend": "default"})
    task = jobs.add.enqueue(2, 3)
    consumer = _consume(tasks_queue, 2)
    assert consumer.deleted == 1 and consumer.failed == 1
    task.refresh()
    assert task.status == TaskResultStatus.SUCCESSFUL and task.return_value == 5
    assert DeadLetter.objects.get().message_id == stray
    assert not TaskResultRow.objects.filter(id=stray).exists()
    assert not Delivery.objects.exists()


def test_a_task_started_by_the_read_records_who_started_it(tasks_queue):
    result = jobs.add.enqueue(1, 1)
    _consume(tasks_queue, 1)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert len(result.worker_ids) == 1 and result.worker_ids[0] == worker_id()
    assert result.started_at is not None and result.started_at <= result.finished_at


def test_the_success_is_recorded_before_task_finished_is_sent(tasks_queue):
    results = [jobs.add.enqueue(i, 1) for i in range(3)]
    seen: list[tuple[str, str]] = []

    def finished(sender, task_result, **kwargs):
        seen.append((task_result.id, jobs.add.get_result(task_result.id).status))

    task_finished.connect(finished)
    try:
        _consume(tasks_queue, 3)
    finally:
        task_finished.disconnect(finished)
    assert seen == [(r.id, TaskResultStatus.SUCCESSFUL) for r in results]
    assert not Delivery.objects.exists()


def test_a_stop_hands_back_what_was_not_started(tasks_queue):
    Queue.objects.filter(name=tasks_queue).update(max_retries=3)
    results = [jobs.add.enqueue(i, 1) for i in range(3)]
    consumer = TaskConsumer(tasks_queue, vt=30)

    def started(sender, task_result, **kwargs):
        consumer.stop()  # as SIGTERM does, during the first task

    task_started.connect(started)
    try:
        consumer.run()
    finally:
        task_started.disconnect(started)
    assert consumer.deleted == 1 and consumer.failed == 0
    first, *rest = results
    first.refresh()
    assert first.status == TaskResultStatus.SUCCESSFUL
    for result in rest:
        result.refresh()
        assert result.status == TaskResultStatus.READY and result.worker_ids == []
    # Visible again at once, read once.
    again = pull.read(tasks_queue, vt=30, qty=10)
    assert sorted(str(m.message_id) for m in again) == sorted(r.id for r in rest)
    assert all(m.read_ct == 2 for m in again)


def test_a_task_that_succeeded_is_not_run_again_when_its_message_comes_back(tasks_queue, tmp_path):
    Queue.objects.filter(name=tasks_queue).update(max_retries=3)
    path = tmp_path / "runs"
    result = jobs.touch.enqueue(str(path))
    # A worker recorded the success, then died before the message was deleted.
    [message] = pull.read(tasks_queue, vt=0)
    done = run(message.message_id, attempt=1, max_attempts=1)
    assert done is not None
    record(done)
    consumer = _consume(tasks_queue, 1)
    assert consumer.deleted == 1 and not Delivery.objects.exists()
    assert path.read_text() == "ran\n"
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 1


def test_a_success_the_lost_connection_kept_from_recording_is_run_again(tasks_queue, tmp_path):
    """The statement that was to record a success (with the next task's start) fails: the
    success is not dropped with it, its message is not deleted, and the task runs again
    once its visibility timeout runs out."""
    Queue.objects.filter(name=tasks_queue).update(max_retries=3)
    lost = jobs.lose_connection.enqueue(str(tmp_path / "lost"))
    after = jobs.add.enqueue(2, 2)
    consumer = TaskConsumer(tasks_queue, vt=1, max_messages=2)
    consumer.run()
    # The next task's start failed on the dead connection (an attempt of that task's), and
    # so did the batch's last try to record the success: nothing of the batch was deleted.
    # The next task, read again at once (no backoff), ran on a new connection.
    assert consumer.deleted == 1 and consumer.failed == 1
    lost.refresh()
    after.refresh()
    assert lost.status == TaskResultStatus.RUNNING
    assert after.status == TaskResultStatus.SUCCESSFUL
    assert Delivery.objects.filter(message_id=lost.id).exists()
    # Another worker, once its message is visible again, runs it a second time.
    _consume(tasks_queue, 1)
    lost.refresh()
    assert lost.status == TaskResultStatus.SUCCESSFUL
    assert len(lost.worker_ids) == 2
    assert not Delivery.objects.exists()
