"""``PgmbBackend``: Django's Tasks framework on pgmb's messages.

Enqueueing a task publishes one message (routing key ``tasks.<queue_name>``) and writes
its result row, both in the caller's transaction; a worker (``manage.py pgmb_tasks_worker``)
runs the message with :func:`pgmb.tasks.executor.run_task` and records the outcome.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from functools import partial
from typing import Any, ParamSpec, TypeVar

from django.conf import settings
from django.core import checks
from django.db import connections, transaction

from .. import conf, sql, tracing
from ..durations import check_time
from ..errors import InvalidBody, PgmbError
from ..ids import uuid7
from ..message_limits import body_problem
from ..options import check_options
from ..routing import validate_routing_key
from . import naming, results
from .compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)

T = TypeVar("T")
P = ParamSpec("P")

#: The keys of a PgmbBackend's OPTIONS.
OPTIONS = {"DATABASE"}


class UnroutedTask(InvalidTask, PgmbError):
    """No pgmb queue is bound to the task's routing key: nothing would ever run it."""


class PgmbBackend(BaseTaskBackend):
    """Runs tasks from pgmb queues. Configure it in ``TASKS``::

        TASKS = {
            "default": {
                "BACKEND": "pgmb.tasks.PgmbBackend",
                "QUEUES": ["default", "emails"],
                "OPTIONS": {"DATABASE": "default"},  # optional: PGMB["DATABASE"]
            }
        }

    A task on queue ``emails`` becomes a message with routing key ``tasks.emails``, run by
    ``manage.py pgmb_tasks_worker`` from the pgmb queue ``tasks_emails``. Retries and dead
    letters follow that queue's ``max_retries`` and backoff.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    # Django runs higher priorities first, pgmb lower ones: a task's priority is negated.
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self._database: str | None = self.options.get("DATABASE")

    @property
    def database(self) -> str:
        """The database alias of this backend's messages and results."""
        return self._database or conf.get().DATABASE

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        problem = naming.queue_name_problem(task.queue_name)
        if problem is not None:
            raise InvalidTask(problem)

    def enqueue(
        self,
        task: Task[P, T],
        args: P.args,  # type: ignore[valid-type]
        kwargs: P.kwargs,  # type: ignore[valid-type]
    ) -> TaskResult[T]:
        """Publish the task's message and write its READY result, in one statement of the
        caller's transaction: if it rolls back, the task was never enqueued.

        Raises the framework's ``InvalidTask`` for a task this backend cannot run,
        ``TypeError`` for arguments that are not JSON, and :class:`UnroutedTask` when no
        pgmb queue is bound to ``tasks.<queue_name>``; nothing is written then.
        """
        self.validate_task(task)
        message_id = uuid7()
        # TaskResult checks that the arguments are JSON (a TypeError) before anything is
        # written.
        result: TaskResult[T] = TaskResult(
            task=task,
            id=str(message_id),
            status=TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        try:
            args_json = json.dumps(result.args, allow_nan=False)
            kwargs_json = json.dumps(result.kwargs, allow_nan=False)
        except ValueError as exc:
            raise TypeError(f"task arguments must be JSON: {exc}") from exc
        key = naming.routing_key(task.queue_name)
        # The checks pgmb.publish.send makes of a message, before anything is written.
        validate_routing_key(key)
        body = {"task": task.module_path, "backend": self.alias}
        problem = body_problem(body)
        if problem is not None:
            raise InvalidBody(f"message refused: {problem}")
        options = check_options(message_id, priority=-task.priority)
        run_after = None if task.run_after is None else check_time(task.run_after)
        # One statement: the message and its result row are written together or not at
        # all, with no savepoint inside the caller's transaction nor a transaction of its
        # own in autocommit.
        with connections[self.database].cursor() as cursor:
            cursor.execute(
                sql.query("tasks.sql", "enqueue"),
                {
                    "id": message_id,
                    "key": key,
                    "body": json.dumps(body),
                    "message_priority": options.priority,
                    "backend": self.alias,
                    "task_path": task.module_path,
                    "queue_name": task.queue_name,
                    "priority": task.priority,
                    "run_after": run_after,
                    "args": args_json,
                    "kwargs": kwargs_json,
                    # The enqueuer's trace context (pgmb.tracing), or nothing.
                    "headers": json.dumps(tracing.publish_headers()),
                },
            )
            (enqueued_at,) = cursor.fetchone()
        if enqueued_at is None:
            raise UnroutedTask(
                f"no pgmb queue is bound to {key!r}, so task {task.module_path} would "
                "never run: run 'manage.py pgmb_tasks_worker --create-queues' (it "
                f"creates the pull queue {naming.pgmb_queue(task.queue_name)!r}) or "
                "start the worker"
            )
        object.__setattr__(result, "enqueued_at", enqueued_at)
        # Like the message, the enqueue happened only if the transaction commits.
        transaction.on_commit(
            partial(task_enqueued.send, type(self), task_result=result), using=self.database
        )
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as stored now; ``TaskResultDoesNotExist`` for an unknown id
        (or one of a transaction that has not committed)."""
        try:
            key = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        with connections[self.database].cursor() as cursor:
            cursor.execute(
                sql.query("tasks.sql", "get_result"),
                {"id": key, "prefix": naming.ROUTING_PREFIX},
            )
            row = cursor.fetchone()
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        return results.from_row(row)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        """Misconfiguration of this backend, for ``manage.py check``."""
        where = f"TASKS[{self.alias!r}]"
        for name in sorted(self.queues):
            problem = naming.queue_name_problem(name)
            if problem is not None:
                yield checks.Error(f"{where}: {problem}.", id="pgmb.E101")
        unknown = set(self.options) - OPTIONS
        if unknown:
            yield checks.Error(
                f"{where}['OPTIONS'] has unknown keys {sorted(unknown)} (known: "
                f"{sorted(OPTIONS)}).",
                id="pgmb.E102",
            )
        if self._database is not None and self._database not in settings.DATABASES:
            yield checks.Error(
                f"{where}['OPTIONS']['DATABASE'] names {self._database!r}, which is not in "
                "DATABASES.",
                id="pgmb.E103",
            )
