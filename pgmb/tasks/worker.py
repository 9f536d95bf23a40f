"""The worker side of :class:`~pgmb.tasks.PgmbBackend`: the pull queues that hold a
backend's tasks, and the handler that runs their messages.

``manage.py pgmb_tasks_worker`` uses both; ``manage.py pgmb_consume tasks_default
--handler pgmb.tasks.worker.run_message`` runs one queue with pgmb's plain consumer.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import close_old_connections, connections, transaction

from .. import conf, sql
from ..errors import PgmbError
from ..models import Queue
from ..pull import Message
from . import naming
from .executor import run_task


class QueueConflict(PgmbError):
    """A pgmb queue has the name a Tasks queue needs, but is not that queue's pull queue."""


def ensure_queues(queue_names: Iterable[str], *, using: str | None = None) -> list[str]:
    """Create the pull queue ``tasks_<name>`` bound to ``tasks.<name>`` for each Tasks
    queue that has none; return the pgmb queue names, in order.

    A queue that exists keeps its settings (retries, backoff, lease: tune them freely).
    Raises :class:`QueueConflict` when a queue of that name is bound to another key or
    delivers to a worker.
    """
    alias = using or conf.get().DATABASE
    wanted = list(queue_names)
    for queue_name in wanted:
        problem = naming.queue_name_problem(queue_name)
        if problem is not None:
            raise ValueError(problem)
    # One transaction: a conflict on one queue creates none.
    with transaction.atomic(using=alias):
        return [_ensure(queue_name, alias) for queue_name in wanted]


def _ensure(queue_name: str, alias: str) -> str:
    name, key = naming.pgmb_queue(queue_name), naming.routing_key(queue_name)
    queue, _ = Queue.objects.using(alias).get_or_create(
        name=name, defaults={"binding_key": key, "worker": None}
    )
    if queue.binding_key != key or queue.worker_id is not None:
        raise QueueConflict(
            f"queue {name!r} exists but is not the pull queue of Tasks queue "
            f"{queue_name!r}: it must be bound to {key!r} with no worker (it is bound to "
            f"{queue.binding_key!r}" + (", with a worker)" if queue.worker_id is not None else ")")
        )
    return name


def max_attempts(message: Message, *, using: str | None = None) -> int:
    """1 + the max_retries of the queue ``message`` was read from."""
    with connections[using or conf.get().DATABASE].cursor() as cursor:
        cursor.execute(sql.query("tasks.sql", "max_attempts"), {"delivery_id": message.id})
        row = cursor.fetchone()
    # Gone (settled meanwhile): a failure cannot dead-letter it, so it is not the last.
    return int(row[0]) if row else message.read_ct + 1


def run_message(message: Message, *, using: str | None = None) -> None:
    """The handler of a tasks queue's consumer: run the task of one pull message.

    Returns when the task succeeded (the consumer deletes the message) and raises when it
    failed (the consumer fails it: retried after the queue's backoff, dead-lettered after
    its last attempt). See :func:`pgmb.tasks.executor.run_task`.
    """
    _refresh_connections()
    try:
        run_task(
            message.message_id,
            attempt=message.read_ct,
            max_attempts=max_attempts(message, using=using),
            using=using,
        )
    finally:
        _refresh_connections()


def _refresh_connections() -> None:
    # As around a request: a connection the database dropped, or one past CONN_MAX_AGE, is
    # replaced rather than failing every task after it. Not inside a transaction (a caller
    # of its own, a test), which closing would end.
    if not any(c.in_atomic_block for c in connections.all(initialized_only=True)):
        close_old_connections()
