"""The worker side of :class:`~pgmb.tasks.PgmbBackend`: the pull queues that hold a
backend's tasks, and the handler that runs their messages.

``manage.py pgmb_tasks_worker`` uses both (:class:`TaskConsumer`); ``manage.py pgmb_consume
tasks_default --handler pgmb.tasks.worker.run_message`` runs one queue with pgmb's plain
consumer (one statement more a task).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import psycopg
from django.db import close_old_connections, connections, transaction

from .. import conf
from ..consume import Consumer
from ..db.statements import Call
from ..errors import PgmbError
from ..models import Queue
from ..pull import Message
from . import executor, naming

log = logging.getLogger("pgmb.tasks")


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


def run_message(message: Message, *, using: str | None = None) -> None:
    """The handler of a tasks queue's plain consumer: run the task of one pull message.

    Returns when the task succeeded (its success recorded; the consumer deletes the
    message) and raises when it failed (the consumer fails it: retried after the queue's
    backoff, dead-lettered after its last attempt). See :func:`pgmb.tasks.executor.run_task`.
    """
    _refresh_connections()
    try:
        done = executor.run(
            message.message_id,
            attempt=message.read_ct,
            delivery_id=message.id,
            using=using,
        )
        if done is not None:
            executor.record(done, using=using)
    finally:
        _refresh_connections()


class TaskRunner:
    """The handler of :class:`TaskConsumer`: runs a tasks queue's messages one by one and
    records each success in the statement that starts the next task
    (:func:`pgmb.tasks.executor.run`): one round trip a task, plus the consumer's read (which
    starts the first task) and delete of a batch. :meth:`flush` records the last success of
    a batch."""

    def __init__(self, queue: str, *, using: str | None = None) -> None:
        self.queue = queue
        self.using = using
        self._done: executor.Success | None = None
        #: The task the batch's read started (:meth:`TaskConsumer.read_call`).
        self.started: executor.Started | None = None

    def __call__(self, message: Message) -> None:
        previous, self._done = self._done, None
        started, self.started = self.started, None
        try:
            self._done = executor.run(
                message.message_id,
                attempt=message.read_ct,
                delivery_id=message.id,
                previous=previous,
                started=started,
                using=self.using,
            )
        finally:
            if previous is not None and not executor.recorded(previous):
                # The statement that was to record it failed (a lost connection): flush
                # tries again, and if that fails too, the batch's messages come back.
                self._done = previous

    def flush(self) -> bool:
        """Record the success still held; whether that worked (a database error is
        logged, not raised: the loop goes on)."""
        done, self._done = self._done, None
        try:
            if done is not None:
                executor.record(done, using=self.using)
        except Exception:
            log.exception("could not record the success of task %s", done and done.result.id)
            return False
        finally:
            # As around a request, once a batch (see run_message).
            _refresh_connections()
        return True


class TaskConsumer(Consumer):
    """A tasks queue's consumer: its read starts the first task of the batch, and
    :class:`TaskRunner` records each task's success in the statement that starts the next
    one; the batch's messages are deleted after the last success is recorded."""

    def __init__(
        self,
        queue: str,
        *,
        vt: float | None = None,
        using: str | None = None,
        max_messages: int | None = None,
    ) -> None:
        self.runner = TaskRunner(queue, using=using)
        super().__init__(queue, self.runner, vt=vt, using=using, max_messages=max_messages)

    def read_call(self, qty: int) -> Call[list[Message]]:
        # The read also starts the first message's task: an idle worker's task starts
        # after one commit, not two.
        call = executor.read_and_start_call(self.queue, self.vt or 0, qty)

        def read(names: list[str], rows: list[tuple[Any, ...]]) -> list[Message]:
            messages, self.runner.started = call.read(names, rows)
            return messages

        return Call(call.query, call.params, read)

    def settle_handled(self, conn: psycopg.Connection[Any], done: list[Message]) -> int:
        if not self.runner.flush():
            # A success not recorded: its message must come back, and its task run
            # again. The batch's messages are left to their visibility timeout.
            return 0
        return super().settle_handled(conn, done)


def _refresh_connections() -> None:
    # As around a request: a connection the database dropped, or one past CONN_MAX_AGE, is
    # replaced rather than failing every task after it. Not inside a transaction (a caller
    # of its own, a test), which closing would end.
    if not any(c.in_atomic_block for c in connections.all(initialized_only=True)):
        close_old_connections()
