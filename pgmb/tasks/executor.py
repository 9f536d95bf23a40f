"""Running one task message: the part of a worker that knows about tasks.

A consumer of the pgmb queue ``tasks_<queue_name>`` calls :func:`run_task` (or, to save
a round trip per task, :func:`run` and :func:`record`) once per message, outside any
transaction, with the message's id, the attempt's number and how many attempts the queue
allows. It returns when the task succeeded (acknowledge the message) and raises the
task's exception when it failed (fail the message: the queue retries it with backoff, and
dead-letters it after its last attempt).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import traceback
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connections

from .. import conf, pull, sql
from ..db.statements import Call
from . import results
from .compat import (
    InvalidTask,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)

logger = logging.getLogger(__name__)


def worker_id() -> str:
    """This process, as recorded in a result's ``worker_ids`` (at most 64 characters)."""
    return f"{socket.gethostname()[:50]}:{os.getpid()}"


def _error(exc: BaseException) -> TaskError:
    kind = type(exc)
    return TaskError(
        exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
        traceback="".join(traceback.format_exception(exc)),
    )


def _execute(alias: str, name: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
    with connections[alias].cursor() as cursor:
        cursor.execute(sql.query("tasks.sql", name), params)
        row = cursor.fetchone()
    return None if row is None else tuple(row)


def _record_failure(
    alias: str, message_id: uuid.UUID, exc: BaseException, *, final: bool
) -> tuple[TaskError, str, Any]:
    error = _error(exc)
    row = _execute(
        alias,
        "fail",
        {
            "id": message_id,
            "final": final,
            "error": json.dumps(
                {"exception_class_path": error.exception_class_path, "traceback": error.traceback}
            ),
        },
    )
    status, finished_at = row if row is not None else (None, None)
    return error, status, finished_at


@dataclass(frozen=True)
class Success:
    """A task that returned, whose success is not recorded yet: :func:`record` (or the
    :func:`run` of the next task) records it, then sends ``task_finished``."""

    result: TaskResult
    value: Any
    value_json: str
    sender: type


@dataclass(frozen=True)
class Started:
    """A task started by the statement that read its message (:func:`read_and_start_call`),
    as ``step`` would have started it."""

    message_id: uuid.UUID
    #: The row as ``step`` returns it: no success recorded, the attempts allowed, then
    #: :data:`results.COLUMNS` (NULLs: the task was not started).
    row: tuple[Any, ...]


def read_and_start_call(
    queue: str, vt: float, qty: int
) -> Call[tuple[list[pull.Message], Started | None]]:
    """Read up to ``qty`` messages of the tasks queue ``queue`` and start the task of the
    first, in one statement: the messages, and the first one's :class:`Started` (None when
    nothing was read). Pass it to :func:`run` for that message."""

    def read(
        names: list[str], rows: list[tuple[Any, ...]]
    ) -> tuple[list[pull.Message], Started | None]:
        width = len(pull.MESSAGE_COLUMNS)
        messages = [pull.message_of(row[:width]) for row in rows]
        if not messages:
            return messages, None
        return messages, Started(messages[0].message_id, (None, *rows[0][width:]))

    return Call(
        sql.query("tasks.sql", "read_and_start"),
        {"queue": queue, "vt": vt, "qty": qty, "worker_id": worker_id()},
        read,
    )


def _step(
    alias: str,
    *,
    start: uuid.UUID | None = None,
    delivery_id: int | None = None,
    done: Success | None = None,
) -> tuple[Any, ...]:
    row = _execute(
        alias,
        "step",
        {
            "done_id": uuid.UUID(done.result.id) if done else None,
            "return_value": done.value_json if done else None,
            "id": start,
            "worker_id": worker_id(),
            "delivery_id": delivery_id,
        },
    )
    assert row is not None  # the statement returns one row
    if done is not None:
        _finished(done, row[0])
    return row


def _finished(done: Success, finished_at: Any) -> None:
    result = done.result
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", finished_at)
    object.__setattr__(result, "_return_value", done.value)
    task_finished.send(sender=done.sender, task_result=result)


def recorded(done: Success) -> bool:
    """Whether the success of ``done`` was recorded (by :func:`record` or a next :func:`run`)."""
    return done.result.status == TaskResultStatus.SUCCESSFUL


def record(done: Success, *, using: str | None = None) -> None:
    """Record the success of ``done``, then send ``task_finished``. One statement."""
    _step(using or conf.get().DATABASE, done=done)


def run_task(
    message_id: uuid.UUID | str,
    *,
    attempt: int,
    max_attempts: int | None,
    using: str | None = None,
) -> TaskResult | None:
    """Run the task of message ``message_id`` and record its outcome in its result.

    ``attempt`` counts from 1; a failure of attempt ``max_attempts`` (1 + the queue's
    max_retries) is the task's last: its status becomes FAILED, otherwise READY until the
    next attempt. The framework's signals are sent as it does: ``task_started`` when the
    task starts, ``task_finished`` when its status is final (SUCCESSFUL or FAILED).

    Returns the result; None for a task that had already succeeded (its message came back
    before it was acknowledged: the task is not run twice). Raises the task's exception
    when it fails, and the framework's ``InvalidTask`` when the message carries no task
    this worker can run (no result row, a task path that does not import, another
    backend's task): each such failure is an attempt like any other.
    """
    done = run(message_id, attempt=attempt, max_attempts=max_attempts, using=using)
    if done is None:
        return None
    record(done, using=using)
    return done.result


def run(
    message_id: uuid.UUID | str,
    *,
    attempt: int,
    max_attempts: int | None = None,
    delivery_id: int | None = None,
    previous: Success | None = None,
    started: Started | None = None,
    using: str | None = None,
) -> Success | None:
    """:func:`run_task` up to the record of its success, which is left to the caller
    (:func:`record`, or the ``run`` of the next task as ``previous``).

    ``delivery_id`` is the message as read from a pull queue: with ``max_attempts`` None,
    its queue's max_retries tell the attempts allowed. ``previous`` is recorded in the
    statement that starts this task (its ``task_finished`` is sent then). Starting the
    task is one statement; a failure is recorded in one more. ``started``: the task was
    started by the read of its message (:func:`read_and_start_call`), so no statement
    starts it here (``previous`` is then recorded by one of its own).
    """
    from .backend import PgmbBackend

    alias = using or conf.get().DATABASE
    mid = uuid.UUID(str(message_id))
    if started is not None and started.message_id == mid:
        if previous is not None:
            record(previous, using=alias)
        row = started.row
    else:
        row = _step(alias, start=mid, delivery_id=delivery_id, done=previous)
    allowed, row = row[1], row[2:]
    if max_attempts is None:
        # Gone (settled meanwhile): a failure cannot dead-letter it, so it is not the last.
        max_attempts = int(allowed) if allowed is not None else attempt + 1
    final = attempt >= max_attempts
    if row[0] is None:
        if _execute(alias, "status", {"id": mid}) is not None:
            logger.info("task %s already succeeded: not run again", mid)
            return None
        raise InvalidTask(f"message {mid} carries no task: it has no result row")
    try:
        result = results.from_row(row)
        backend = result.task.get_backend()
        if not isinstance(backend, PgmbBackend):
            raise InvalidTask(
                f"task {result.task.module_path} is enqueued on backend {result.backend!r}, "
                f"a {type(backend).__name__}, not a PgmbBackend"
            )
    except Exception as exc:
        _record_failure(alias, mid, exc, final=final)
        raise
    sender = type(backend)
    task = result.task
    task_started.send(sender=sender, task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
        else:
            value = task.call(*result.args, **result.kwargs)
        # What it returns is stored as JSON; anything else fails the attempt, as in the
        # framework's own backends.
        value = normalize_json(value)
        value_json = json.dumps(value, allow_nan=False)
    except KeyboardInterrupt:
        raise  # the worker is stopping: the message comes back when its lease runs out
    except BaseException as exc:
        error, status, finished_at = _record_failure(alias, mid, exc, final=final)
        result.errors.append(error)
        object.__setattr__(result, "status", TaskResultStatus(status))
        object.__setattr__(result, "finished_at", finished_at)
        if final:
            task_finished.send(sender=sender, task_result=result)
        raise
    return Success(result, value, value_json, sender)
