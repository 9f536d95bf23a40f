"""A tasks worker process (``manage.py pgmb_tasks_worker``): one pull-queue consumer per
Tasks queue, each on a thread of its own, started once the database accepts connections.

A worker started with its database (in a container, after a failover) waits for it as
``pgmb_consume`` does; SIGTERM or SIGINT stop it after the tasks in hand.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import OperationalError, connections

from ..consume import Consumer
from ..db.backoff import Backoff
from ..db.error_text import first_line
from ..db.reconnecting import WARN_EVERY
from .worker import TaskConsumer, ensure_queues

log = logging.getLogger("pgmb.tasks")


def start(
    names: list[str],
    alias: str,
    vt: float | None,
    stopping: threading.Event,
    consumers: list[Consumer],
) -> list[str] | None:
    """The pull queues (created if missing), with their consumers connected into
    ``consumers``, once the database accepts connections; None if stopped first.

    Raises what the database refuses (a ``PgmbError`` or ``ValueError`` for the queues,
    a ``psycopg.Error`` for a consumer's connection), with every consumer closed.
    """
    backoff = Backoff()
    warned_at: float | None = None
    while True:
        try:
            queues = ensure_queues(names, using=alias)
            break
        except OperationalError as exc:
            connections[alias].close()
            now = time.monotonic()
            if warned_at is None or now - warned_at >= WARN_EVERY:
                warned_at = now
                log.warning("cannot reach the database (%s): trying again", first_line(exc))
            if stopping.wait(backoff.next()):
                return None
    if warned_at is not None:
        log.warning("reached the database")
    consumers.extend(TaskConsumer(q, vt=vt, using=alias) for q in queues)
    try:
        for consumer in consumers:
            # Stopped meanwhile: the rest are not connected, and close() is harmless.
            if stopping.is_set() or consumer.connect_waiting() is None:
                for each in consumers:
                    each.close()
                return None
    except BaseException:
        for consumer in consumers:
            consumer.close()
        raise
    return queues


def run(consumers: list[Consumer], started: Callable[[], None]) -> list[str]:
    """Run each consumer on a thread until SIGTERM/SIGINT or the first one that fails
    (then all stop); ``started`` is called once they run. What stopped them, per queue."""
    failures: list[str] = []

    def consume(consumer: Consumer) -> None:
        try:
            consumer.run()
        except Exception as exc:  # reported by the main thread, which stops the others
            log.exception("consumer of %s stopped", consumer.queue)
            failures.append(f"{consumer.queue}: {exc}")
        finally:
            connections.close_all()  # this thread's Django connections

    def stop(signum: int, frame: Any) -> None:
        for consumer in consumers:
            consumer.stop()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    threads = [
        threading.Thread(target=consume, args=(c,), name=f"pgmb-tasks-{c.queue}") for c in consumers
    ]
    try:
        for thread in threads:
            thread.start()
        started()
        # Joined in slices: signal handlers run in this thread, between the slices.
        while any(t.is_alive() for t in threads):
            for thread in threads:
                thread.join(timeout=0.2)
            if failures:
                stop(0, None)
    finally:
        stop(0, None)
        for thread in threads:
            thread.join()
        for s, h in previous.items():
            signal.signal(s, h)
    return failures
