"""Rows of ``pgmb_task_result`` as the framework's ``TaskResult``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.utils.module_loading import import_string

from ..db.values import jsonb
from .compat import InvalidTask, Task, TaskError, TaskResult, TaskResultStatus

#: The columns every result statement of ``pgmb/sql/queries/tasks.sql`` returns, in order.
COLUMNS = (
    "id",
    "backend",
    "task_path",
    "queue_name",
    "priority",
    "run_after",
    "args",
    "kwargs",
    "status",
    "enqueued_at",
    "started_at",
    "last_attempted_at",
    "finished_at",
    "return_value",
    "errors",
    "worker_ids",
)


def load_task(
    path: str, *, backend: str, queue_name: str, priority: int, run_after: datetime | None
) -> Task:
    """The task at ``path``, with the options it was enqueued with.

    Raises :class:`InvalidTask` when ``path`` does not name a task (a module removed or
    renamed since, a function that lost its ``@task``).
    """
    try:
        found = import_string(path)
    except ImportError as exc:
        raise InvalidTask(f"task {path!r} cannot be imported: {exc}") from exc
    if not isinstance(found, Task):
        raise InvalidTask(f"{path!r} is not a task (decorate it with @task)")
    return found.using(
        backend=backend, queue_name=queue_name, priority=priority, run_after=run_after
    )


def from_row(row: Sequence[Any]) -> TaskResult:
    """A ``TaskResult`` from a row of :data:`COLUMNS`."""
    r = dict(zip(COLUMNS, row, strict=True))
    task = load_task(
        r["task_path"],
        backend=r["backend"],
        queue_name=r["queue_name"],
        priority=r["priority"],
        run_after=r["run_after"],
    )
    result: TaskResult = TaskResult(
        task=task,
        id=str(r["id"]),
        status=TaskResultStatus(r["status"]),
        enqueued_at=r["enqueued_at"],
        started_at=r["started_at"],
        last_attempted_at=r["last_attempted_at"],
        finished_at=r["finished_at"],
        args=jsonb(r["args"]),
        kwargs=jsonb(r["kwargs"]),
        backend=r["backend"],
        errors=[TaskError(**error) for error in jsonb(r["errors"])],
        worker_ids=list(r["worker_ids"]),
    )
    # Not an argument of TaskResult: the framework's backends set it the same way.
    object.__setattr__(result, "_return_value", jsonb(r["return_value"]))
    return result
