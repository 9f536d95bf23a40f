"""Enqueueing and reading results with the framework's API, against real PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core import checks
from django.db import connections, transaction
from django.test import override_settings
from django.utils import timezone
from django_tasks import TaskResultStatus, task_backends
from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
from django_tasks.signals import task_enqueued

from pgmb import pull
from pgmb.models import Delivery, Message, Queue
from pgmb.models import TaskResult as TaskResultRow
from pgmb.tasks import PgmbBackend, UnroutedTask
from pgmb.tasks.worker import ensure_queues
from tests.tasks import jobs


@pytest.fixture
def task_queues(db):
    """The pull queues of the test backend's Tasks queues, as the worker creates them."""
    ensure_queues(["default", "emails"])
    return {
        q.name.removeprefix("tasks_"): q for q in Queue.objects.filter(name__startswith="tasks_")
    }


def test_the_backend_is_pgmb_and_says_what_it_supports():
    backend = task_backends["default"]
    assert isinstance(backend, PgmbBackend)
    assert backend.supports_defer
    assert backend.supports_get_result
    assert backend.supports_async_task
    assert backend.supports_priority


def test_enqueue_publishes_one_message_and_a_ready_result(task_queues, django_assert_num_queries):
    # One statement in the caller's transaction: the message and its result row, with no
    # savepoint around them.
    with django_assert_num_queries(1):
        result = jobs.add.enqueue(2, b=3)
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at is not None
    assert result.args == [2] and result.kwargs == {"b": 3}
    message = Message.objects.get(id=result.id)
    assert message.routing_key == "tasks.default"
    assert message.body == {"task": "tests.tasks.jobs.add", "backend": "default"}
    delivery = Delivery.objects.get(message=message)
    assert delivery.queue == task_queues["default"]

    read = jobs.add.get_result(result.id)
    assert read.id == result.id
    assert read.status == TaskResultStatus.READY
    assert read.args == [2] and read.kwargs == {"b": 3}
    assert read.enqueued_at == result.enqueued_at
    assert read.task.func is jobs.add.func
    assert read.worker_ids == [] and read.errors == []
    assert not read.is_finished
    with pytest.raises(ValueError, match="not finished"):
        read.return_value  # noqa: B018


def test_the_queue_name_is_the_routing_key(task_queues):
    result = jobs.greet.enqueue("ada")
    assert Message.objects.get(id=result.id).routing_key == "tasks.emails"
    assert Delivery.objects.get(message_id=result.id).queue == task_queues["emails"]
    moved = jobs.add.using(queue_name="emails").enqueue(1, 1)
    assert Message.objects.get(id=moved.id).routing_key == "tasks.emails"
    assert jobs.add.get_result(moved.id).task.queue_name == "emails"


def test_run_after_delays_the_message(task_queues):
    at = timezone.now() + timedelta(hours=1)
    result = jobs.add.using(run_after=at).enqueue(1, 2)
    assert Message.objects.get(id=result.id).available_at == at
    assert Delivery.objects.get(message_id=result.id).available_at == at
    assert jobs.add.get_result(result.id).task.run_after == at


def test_a_rolled_back_enqueue_leaves_nothing(task_queues):
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        result = jobs.add.enqueue(1, 2)
        assert jobs.add.get_result(result.id).status == TaskResultStatus.READY
        raise Rollback
    with pytest.raises(TaskResultDoesNotExist):
        jobs.add.get_result(result.id)
    assert not Message.objects.filter(id=result.id).exists()


def test_enqueued_is_signalled_at_commit_only(task_queues, django_capture_on_commit_callbacks):
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result.id, task_result.status))

    task_enqueued.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            result = jobs.add.enqueue(1, 2)
            assert seen == []
        assert seen == [(PgmbBackend, result.id, TaskResultStatus.READY)]
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            jobs.add.enqueue(1, 2)
            1 / 0  # noqa: B018
        assert len(seen) == 1
    finally:
        task_enqueued.disconnect(receiver)


def test_a_queue_nothing_consumes_is_refused_and_nothing_is_written(
    make_queue, django_assert_num_queries
):
    make_queue(binding_key="tasks.emails")  # not the task's queue
    before = Message.objects.count()
    # One statement that writes nothing and raises nothing in the database: the caller's
    # transaction goes on (the queries below run in it), with no savepoint to roll back.
    with (
        django_assert_num_queries(1),
        pytest.raises(
            UnroutedTask, match=r"no pgmb queue is bound to 'tasks.default'.*tasks_default"
        ),
    ):
        jobs.add.enqueue(1, 2)
    assert Message.objects.count() == before
    assert not Delivery.objects.exists()
    assert not TaskResultRow.objects.exists()
    with pytest.raises(InvalidTaskError):  # what the framework's callers catch
        jobs.add.enqueue(1, 2)


@pytest.mark.parametrize(
    ("args", "error"),
    [((object(),), TypeError), ((float("nan"),), TypeError)],
)
def test_arguments_that_are_not_json_are_refused_before_writing(task_queues, args, error):
    with pytest.raises(error):
        jobs.touch.enqueue(*args)
    assert not Message.objects.exists()


def test_higher_priorities_run_first(task_queues):
    low, high, normal = (jobs.add.using(priority=p).enqueue(1, b=1) for p in (-10, 10, 0))
    # Django runs higher priorities first, pgmb lower ones: the message carries -priority.
    read = pull.read(task_queues["default"].name, 30, 3)
    assert [str(m.message_id) for m in read] == [high.id, normal.id, low.id]


def test_what_the_backend_cannot_do_is_refused_by_the_framework(task_queues):
    with pytest.raises(InvalidTaskError, match="priority"):
        jobs.add.using(priority=101)
    with pytest.raises(InvalidTaskError, match="Queue 'other'"):
        jobs.add.using(queue_name="other")
    with pytest.raises(InvalidTaskError, match="aware"):
        jobs.add.using(run_after=timezone.now().replace(tzinfo=None))
    assert not Message.objects.exists()


def test_unknown_and_malformed_ids_do_not_exist(db):
    with pytest.raises(TaskResultDoesNotExist):
        jobs.add.get_result(str(uuid.uuid4()))
    with pytest.raises(TaskResultDoesNotExist):
        jobs.add.get_result("not-a-uuid")


def test_get_result_is_one_query(task_queues, django_assert_num_queries):
    result = jobs.add.enqueue(1, 2)
    with django_assert_num_queries(1):
        result.refresh()
    assert result.status == TaskResultStatus.READY


def test_async_enqueue_and_get_result(task_queues):
    result = async_to_sync(jobs.add_async.aenqueue)(4, 5)
    assert result.status == TaskResultStatus.READY
    read = async_to_sync(jobs.add_async.aget_result)(result.id)
    assert read.args == [4, 5]


@pytest.mark.parametrize(
    ("queues", "problem"),
    [
        (["default", "Emails"], "'Emails' cannot be used with pgmb"),
        (["a.b"], "'a.b' cannot be used with pgmb"),
        (["x" * 43], "cannot be used with pgmb"),
    ],
)
def test_queue_names_pgmb_cannot_route_are_reported(queues, problem):
    config = {"default": {"BACKEND": "pgmb.tasks.PgmbBackend", "QUEUES": queues}}
    with override_settings(TASKS=config):
        found = list(task_backends["default"].check())
    assert [e.id for e in found] == ["pgmb.E101"]
    assert problem in found[0].msg


def test_a_task_on_such_a_queue_is_refused():
    config = {"default": {"BACKEND": "pgmb.tasks.PgmbBackend", "QUEUES": ["Bad"]}}
    with override_settings(TASKS=config), pytest.raises(InvalidTaskError, match="'Bad'"):
        jobs.add.using(queue_name="Bad")


def test_options_are_checked():
    config = {
        "default": {
            "BACKEND": "pgmb.tasks.PgmbBackend",
            "OPTIONS": {"DATABASE": "nope", "COLOUR": "red"},
        }
    }
    with override_settings(TASKS=config):
        found = list(task_backends["default"].check())
    assert [e.id for e in found] == ["pgmb.E102", "pgmb.E103"]
    assert "'COLOUR'" in found[0].msg and "'nope'" in found[1].msg
    assert all(isinstance(e, checks.Error) for e in found)


def _statements(alias: str = "default") -> tuple[list[str], Callable[..., Any]]:
    """The statements a Django connection runs, recorded by an execute wrapper (which also
    sees savepoints; in autocommit, each statement is a transaction of its own)."""
    seen: list[str] = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    return seen, wrapper


def test_an_enqueue_in_autocommit_is_one_statement_and_one_transaction(transactional_db):
    ensure_queues(["default"])
    conn = connections["default"]
    seen, wrapper = _statements()
    with conn.execute_wrapper(wrapper):
        assert conn.get_autocommit() and not conn.in_atomic_block
        result = jobs.add.enqueue(2, 3)
    assert len(seen) == 1 and "pgmb.enqueue_task(" in seen[0]
    assert Message.objects.filter(id=result.id).exists()
    assert jobs.add.get_result(result.id).enqueued_at == result.enqueued_at
    assert Delivery.objects.filter(message_id=result.id).count() == 1


def test_enqueues_of_a_session_are_not_planned_again(task_queues):
    """The enqueue's statements are planned once a session (pgmb.enqueue_task, decision
    0067): past PostgreSQL's first custom plans, the key's tags are computed by the
    inlined expression, not by running the SQL function pgmb.key_tags at each planning,
    which cost a tenth of a millisecond an enqueue."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SET track_functions = 'all'")
        try:
            for n in range(8):
                jobs.add.enqueue(n, n)
            cursor.execute(
                "SELECT pg_stat_get_xact_function_calls('pgmb.key_tags(text)'::regprocedure),"
                " pg_stat_get_xact_function_calls("
                "'pgmb.enqueue_task(uuid, text, jsonb, integer, text, text, text, integer,"
                " timestamptz, jsonb, jsonb, jsonb)'::regprocedure)"
            )
            key_tags_calls, enqueue_calls = cursor.fetchone()
        finally:
            cursor.execute("RESET track_functions")
    assert enqueue_calls == 8
    assert key_tags_calls is None
    assert TaskResultRow.objects.filter(status="READY").count() == 8
