"""Scheduling a Django task (docs/schedules.md#django-tasks): the Tasks framework has no
scheduling API yet, so :func:`schedule_task` makes a pgmb schedule whose every run
enqueues the task as :meth:`PgmbBackend.enqueue` would (``pgmb.enqueue_task``: the message
and its READY result row, which the worker needs, in the fire's transaction).

Shaped to map onto a framework API when one comes: the task (with ``.using()`` options:
queue, priority, backend), its arguments, and when (``cron`` or ``every``).
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from .. import schedules
from ..errors import InvalidSchedule
from . import naming
from .backend import PgmbBackend
from .compat import Task


def schedule_task(
    task: Task,
    *,
    name: str | None = None,
    cron: str | None = None,
    every: datetime.timedelta | float | None = None,
    timezone: str = "UTC",
    args: list[Any] | tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    missed: str = "once",
) -> int:
    """Enqueue ``task`` (``args``, ``kwargs``) at each due time of ``cron`` (in
    ``timezone``) or every ``every``, through schedule ``name`` (default: the task's
    dotted path). Returns the schedule's id; change it by calling again with the same
    name, pause or remove it with :mod:`pgmb.schedules`. The task's backend must be a
    :class:`PgmbBackend` (its database holds the schedule)."""
    backend = task.get_backend()
    if not isinstance(backend, PgmbBackend):
        raise InvalidSchedule(
            f"task {task.module_path} uses backend {task.backend!r}, not pgmb.tasks.PgmbBackend"
        )
    backend.validate_task(task)
    try:
        json.dumps([list(args), kwargs or {}], allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidSchedule(f"task arguments must be JSON: {exc}") from exc
    spec = {
        "backend": backend.alias,
        "task_path": task.module_path,
        "queue_name": task.queue_name,
        "priority": task.priority,
        "args": list(args),
        "kwargs": kwargs or {},
    }
    return schedules.schedule(
        name or task.module_path,
        naming.routing_key(task.queue_name),
        {"task": task.module_path, "backend": backend.alias},
        cron=cron,
        every=every,
        timezone=timezone,
        missed=missed,
        task=spec,
        using=backend.database,
    )
