"""``manage.py pgmb_tasks_worker``: run the Django tasks of a PgmbBackend's queues."""

from __future__ import annotations

import signal
import threading
from typing import Any

import psycopg
from django.core.management.base import BaseCommand, CommandError, CommandParser

from pgmb.cli_args import positive
from pgmb.consume import Consumer
from pgmb.db.error_text import first_line
from pgmb.errors import PgmbError
from pgmb.process_logging import log_to_stderr
from pgmb.tasks import PgmbBackend, worker_process
from pgmb.tasks.compat import DEFAULT_TASK_QUEUE_NAME, task_backends
from pgmb.tasks.worker import ensure_queues


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
        log_to_stderr(("pgmb.consume", "pgmb.tasks"), opts["verbosity"])
        stopping = threading.Event()
        consumers: list[Consumer] = []

        def stop(signum: int, frame: Any) -> None:
            stopping.set()
            for consumer in consumers:
                consumer.stop()

        # Before the database is reached: a worker still waiting for it stops on them too.
        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            started = worker_process.start(names, backend.database, opts["vt"], stopping, consumers)
        except (PgmbError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        except psycopg.Error as exc:
            raise CommandError(first_line(exc)) from exc
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        if started is None:
            if opts["verbosity"] >= 1:
                self.stdout.write("stopped before the database could be reached")
            return
        queues = started

        def say_started() -> None:
            if opts["verbosity"] >= 1:
                self.stdout.write(f"running tasks from {', '.join(queues)}")
                self.stdout.flush()

        failures = worker_process.run(consumers, say_started)
        if opts["verbosity"] >= 1:
            done = sum(c.deleted for c in consumers)
            failed = sum(c.failed for c in consumers)
            self.stdout.write(f"{done} tasks done, {failed} attempts failed")
        if failures:
            raise CommandError(f"a consumer stopped on an error: {failures[0]}")

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
