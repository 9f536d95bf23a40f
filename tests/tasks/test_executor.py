"""Running task messages (pgmb.tasks.executor.run_task, what a worker calls per message),
observed through the framework's API: status, return value, errors, worker ids, signals."""

from __future__ import annotations

import uuid

import pytest
from django_tasks import TaskResultStatus
from django_tasks.exceptions import InvalidTaskError
from django_tasks.signals import task_finished, task_started

from pgmb import deliveries, pull
from pgmb.models import Queue
from pgmb.models import TaskResult as TaskResultRow
from pgmb.tasks import PgmbBackend
from pgmb.tasks.executor import run_task, worker_id
from pgmb.tasks.worker import ensure_queues, run_message
from tests.tasks import jobs


@pytest.fixture
def task_queues(make_queue):
    return {
        name: make_queue(binding_key=f"tasks.{name}", name=f"tasks_{name}", max_retries=0)
        for name in ("default", "emails")
    }


@pytest.fixture
def signals():
    seen: list[tuple[str, str, str]] = []

    def started(sender, task_result, **kwargs):
        assert sender is PgmbBackend
        seen.append(("started", task_result.id, task_result.status))

    def finished(sender, task_result, **kwargs):
        assert sender is PgmbBackend
        seen.append(("finished", task_result.id, task_result.status))

    task_started.connect(started)
    task_finished.connect(finished)
    yield seen
    task_started.disconnect(started)
    task_finished.disconnect(finished)


def test_a_task_that_returns_is_successful(task_queues, signals):
    result = jobs.greet.enqueue("ada", greeting="hi")
    ran = run_task(result.id, attempt=1, max_attempts=3)
    assert ran is not None and ran.status == TaskResultStatus.SUCCESSFUL
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value["text"] == "hi, ada"
    assert result.worker_ids == [worker_id()]
    assert result.attempts == 1
    assert result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    assert signals == [
        ("started", result.id, TaskResultStatus.RUNNING),
        ("finished", result.id, TaskResultStatus.SUCCESSFUL),
    ]


def test_a_failure_with_attempts_left_is_ready_again(task_queues, signals):
    result = jobs.explode.enqueue("boom")
    with pytest.raises(ValueError, match="boom"):
        run_task(result.id, attempt=1, max_attempts=2)
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.finished_at is None
    [error] = result.errors
    assert error.exception_class is ValueError
    assert error.exception_class_path == "builtins.ValueError"
    assert "ValueError: boom" in error.traceback
    assert "tests/tasks/jobs.py" in error.traceback
    # task_finished only for a final status.
    assert signals == [("started", result.id, TaskResultStatus.RUNNING)]


def test_the_last_failure_is_failed(task_queues, signals):
    result = jobs.explode.enqueue("boom")
    for attempt in (1, 2):
        with pytest.raises(ValueError):
            run_task(result.id, attempt=attempt, max_attempts=2)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.finished_at is not None
    assert len(result.errors) == 2 and result.attempts == 2
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert signals[-1] == ("finished", result.id, TaskResultStatus.FAILED)


def test_the_context_counts_attempts(task_queues):
    result = jobs.flaky.enqueue(succeed_on=3)
    for attempt in (1, 2):
        with pytest.raises(RuntimeError, match=f"attempt {attempt} fails"):
            run_task(result.id, attempt=attempt, max_attempts=5)
    run_task(result.id, attempt=3, max_attempts=5)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    assert [e.exception_class for e in result.errors] == [RuntimeError, RuntimeError]


def test_an_async_task_runs(task_queues):
    result = jobs.add_async.enqueue(20, 22)
    run_task(result.id, attempt=1, max_attempts=1)
    result.refresh()
    assert result.return_value == 42


def test_a_return_value_that_is_not_json_fails_the_attempt(task_queues):
    result = jobs.returns_set.enqueue()
    with pytest.raises(TypeError):
        run_task(result.id, attempt=1, max_attempts=1)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TypeError


def test_a_task_that_succeeded_is_not_run_twice(task_queues, tmp_path):
    path = tmp_path / "runs"
    result = jobs.touch.enqueue(str(path))
    assert run_task(result.id, attempt=1, max_attempts=3) is not None
    # Its message comes back (the worker died before acknowledging it).
    assert run_task(result.id, attempt=2, max_attempts=3) is None
    assert path.read_text() == "ran\n"
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 1


def test_a_message_without_a_task_is_an_invalid_task(db):
    with pytest.raises(InvalidTaskError, match="carries no task"):
        run_task(uuid.uuid4(), attempt=1, max_attempts=1)


def test_a_task_path_that_does_not_import_fails_the_attempt(task_queues):
    result = jobs.add.enqueue(1, 2)
    TaskResultRow.objects.filter(id=result.id).update(task_path="tests.tasks.jobs.gone")
    with pytest.raises(InvalidTaskError, match="cannot be imported"):
        run_task(result.id, attempt=1, max_attempts=1)
    row = TaskResultRow.objects.get(id=result.id)
    assert row.status == "FAILED"
    assert row.errors[0]["exception_class_path"] == "django_tasks.exceptions.InvalidTaskError"


def test_a_task_of_another_backend_is_refused(task_queues):
    result = jobs.add.enqueue(1, 2)
    TaskResultRow.objects.filter(id=result.id).update(
        task_path="tests.tasks.jobs.elsewhere", backend="immediate", queue_name="default"
    )
    with pytest.raises(InvalidTaskError, match="not a PgmbBackend"):
        run_task(result.id, attempt=1, max_attempts=3)
    assert TaskResultRow.objects.get(id=result.id).status == "READY"


def test_a_dead_letter_the_worker_did_not_record_is_failed(task_queues):
    """The worker died during the last attempt: the queue dead-letters the message on its
    own, and the result says FAILED from then on."""
    result = jobs.add.enqueue(1, 2)
    [claim] = deliveries.claim(["tasks_default"])
    assert str(claim.message_id) == result.id and claim.last_attempt
    deliveries.fail([deliveries.Failure(claim.delivery_id, claim.lease_id, error="gone")])
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.finished_at is not None


def test_the_pull_handler_runs_a_read_message_in_two_queries(db, django_assert_num_queries):
    assert ensure_queues(["default"]) == ["tasks_default"]
    result = jobs.add.enqueue(40, 2)
    [message] = pull.read("tasks_default", vt=30)
    assert str(message.message_id) == result.id and message.read_ct == 1
    # Mark it running with the queue's attempts, record the return value.
    with django_assert_num_queries(2):
        run_message(message)
    result.refresh()
    assert result.return_value == 42


def test_the_pull_handler_knows_the_last_attempt(db):
    ensure_queues(["default"])
    pgmb_queue = "tasks_default"
    Queue.objects.filter(name=pgmb_queue).update(max_retries=1, backoff_base=0, backoff_max=0)
    result = jobs.explode.enqueue("no")
    for expected in (TaskResultStatus.READY, TaskResultStatus.FAILED):
        [message] = pull.read(pgmb_queue, vt=30)
        with pytest.raises(ValueError, match="no"):
            run_message(message)
        pull.nack(pgmb_queue, [message], "ValueError: no")
        result.refresh()
        assert result.status == expected
    assert pull.read(pgmb_queue, vt=30) == []
