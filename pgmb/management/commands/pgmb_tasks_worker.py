"""``manage.py pgmb_tasks_worker``: run the Django tasks of a PgmbBackend's queues."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from functools import partial
from typing import Any

import psycopg
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import OperationalError, connections

from pgmb.cli_args import positive
from pgmb.consume import Consumer
from pgmb.db.backoff import Backoff
from pgmb.db.error_text import first_line
from pgmb.db.reconnecting import WARN_EVERY
from pgmb.errors import PgmbError
from pgmb.tasks import PgmbBackend
from pgmb.tasks.compat import DEFAULT_TASK_QUEUE_NAME, task_backends
from pgmb.tasks.worker import ensure_queues, run_message

log = logging.getLogger("pgmb.tasks")


class Command(BaseCommand):
    help = (
        "Run the Django tasks of a pgmb.tasks.PgmbBackend: create the pull queue "
        "tasks_<name> of each Tasks queue if it is missing, then consume them (one thread "
        "per queue). Stops after the tasks in hand on SIGTERM/SIGINT."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue-name",
            action="append",
            dest="queue_names",
            metavar="NAME",
            help="A Tasks queue to run (repeatable; default: the backend's QUEUES).",
        )
        parser.add_argument(
            "--backend",
            default="default",
            metavar="ALIAS",
            help="The TASKS alias of the backend (default %(default)s).",
        )
        parser.add_argument(
            "--vt",
            type=positive(float),
            default=None,
            metavar="SECONDS",
            help="Visibility timeout of each read, extended while the task runs: how long a "
            "dead worker's task waits before it runs again (default: each queue's lease).",
        )
        parser.add_argument(
            "--create-queues",
            action="store_true",
            help="Create the missing pull queues and exit (a deployment step after migrate).",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        backend = self._backend(opts["backend"])
        names = opts["queue_names"] or sorted(backend.queues) or [DEFAULT_TASK_QUEUE_NAME]
        unknown = [n for n in names if backend.queues and n not in backend.queues]
        if unknown:
            raise CommandError(
                f"backend {opts['backend']!r} has no queue {unknown[0]!r} (its QUEUES: "
                f"{', '.join(sorted(backend.queues))})"
            )
        if opts["create_queues"]:
            # A deployment step: a database that cannot be reached is its error.
            try:
                queues = ensure_queues(names, using=backend.database)
            except (PgmbError, ValueError) as exc:
                raise CommandError(str(exc)) from exc
            if opts["verbosity"] >= 1:
                self.stdout.write(f"queues ready: {', '.join(queues)}")
            return
        self._configure_logging(opts["verbosity"])
        stopping = threading.Event()
        consumers: list[Consumer] = []

        def stop(signum: int, frame: Any) -> None:
            stopping.set()
            for consumer in consumers:
                consumer.stop()

        # Before the database is reached: a worker still waiting for it stops on them too.
        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            started = self._start(names, backend.database, opts["vt"], stopping, consumers)
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        if started is None:
            if opts["verbosity"] >= 1:
                self.stdout.write("stopped before the database could be reached")
            return
        queues = started
        failures = self._run(consumers, opts["verbosity"], queues)
        if opts["verbosity"] >= 1:
            done = sum(c.deleted for c in consumers)
            failed = sum(c.failed for c in consumers)
            self.stdout.write(f"{done} tasks done, {failed} attempts failed")
        if failures:
            raise CommandError(f"a consumer stopped on an error: {failures[0]}")

    def _start(
        self,
        names: list[str],
        alias: str,
        vt: float | None,
        stopping: threading.Event,
        consumers: list[Consumer],
    ) -> list[str] | None:
        """The pull queues (created if missing), with their consumers connected into
        ``consumers``, once the database accepts connections (a worker started with its
        database, in a container or after a failover, waits as pgmb_consume does); None if
        stopped first."""
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
            except (PgmbError, ValueError) as exc:
                raise CommandError(str(exc)) from exc
        if warned_at is not None:
            log.warning("reached the database")
        handler = partial(run_message, using=alias)
        consumers.extend(Consumer(q, handler, vt=vt, using=alias) for q in queues)
        try:
            for consumer in consumers:
                # Stopped meanwhile: the rest are not connected, and close() is harmless.
                if stopping.is_set() or consumer.connect_waiting() is None:
                    for each in consumers:
                        each.close()
                    return None
        except psycopg.Error as exc:
            for consumer in consumers:
                consumer.close()
            raise CommandError(first_line(exc)) from exc
        return queues

    def _run(self, consumers: list[Consumer], verbosity: int, queues: list[str]) -> list[str]:
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
            threading.Thread(target=consume, args=(c,), name=f"pgmb-tasks-{c.queue}")
            for c in consumers
        ]
        try:
            for thread in threads:
                thread.start()
            if verbosity >= 1:
                self.stdout.write(f"running tasks from {', '.join(queues)}")
                self.stdout.flush()
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

    def _backend(self, alias: str) -> PgmbBackend:
        try:
            backend = task_backends[alias]
        except Exception as exc:  # the framework's InvalidTaskBackend(Error)
            raise CommandError(f"no Tasks backend {alias!r}: {exc}") from exc
        if not isinstance(backend, PgmbBackend):
            raise CommandError(
                f"Tasks backend {alias!r} is a {type(backend).__name__}, not pgmb.tasks.PgmbBackend"
            )
        return backend

    def _configure_logging(self, verbosity: int) -> None:
        level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
        for name in ("pgmb.consume", "pgmb.tasks"):
            logger = logging.getLogger(name)
            if not logger.handlers and not logging.getLogger().handlers:
                handler = logging.StreamHandler(sys.stderr)
                handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
                logger.addHandler(handler)
            logger.setLevel(level)
