"""``manage.py pgmb_consume QUEUE --handler dotted.path``: consume a pull queue."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import psycopg
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.module_loading import import_string

from pgmb import conf
from pgmb.cli_args import positive
from pgmb.consume import PREFETCH, Consumer
from pgmb.db.error_text import first_line
from pgmb.process_logging import log_to_stderr


class Command(BaseCommand):
    help = (
        "Consume a pull queue (a queue without a worker): read its messages, call the "
        "handler, delete them when it returns, fail them (retry after the queue's backoff) "
        "when it raises. Keeps the messages in hand invisible to other readers while the "
        "handler runs; waits for a database that cannot be reached. Stops after the "
        "messages in hand on SIGTERM/SIGINT."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queue", help="The pull queue's name.")
        parser.add_argument(
            "--handler",
            required=True,
            metavar="DOTTED.PATH",
            help="The function called with each message (a pgmb.pull.Message), or with a "
            "list of them with --batch.",
        )
        parser.add_argument(
            "--batch",
            type=positive(int),
            default=None,
            metavar="N",
            help="Call the handler with lists of up to N messages (default: one message per "
            f"call, {PREFETCH} read at a time).",
        )
        parser.add_argument(
            "--vt",
            type=positive(float),
            default=None,
            metavar="SECONDS",
            help="Visibility timeout of each read (default: the queue's lease); extended "
            "every third of it while the handler runs.",
        )
        parser.add_argument(
            "--poll-interval",
            type=positive(float),
            default=conf.get().DISPATCH_POLL_INTERVAL,
            metavar="SECONDS",
            help="Longest wait between reads when no notification arrives (default %(default)s).",
        )
        parser.add_argument(
            "--max-messages",
            type=positive(int),
            default=None,
            metavar="N",
            help="Stop once N messages were handled (deleted or failed).",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        handler = self._handler(opts["handler"])
        log_to_stderr(("pgmb.consume",), opts["verbosity"])
        consumer = Consumer(
            opts["queue"],
            handler,
            batch=opts["batch"],
            vt=opts["vt"],
            max_messages=opts["max_messages"],
            poll_interval=opts["poll_interval"],
        )

        def stop(signum: int, frame: Any) -> None:
            consumer.stop()

        # Before connecting: a consumer still waiting for the database stops on them too.
        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            try:
                conn = consumer.connect_waiting()
            except psycopg.Error as exc:
                raise CommandError(first_line(exc)) from exc
            if conn is None:
                if opts["verbosity"] >= 1:
                    self.stdout.write("stopped before the database could be reached")
                return
            if opts["verbosity"] >= 1:
                self.stdout.write(f"consuming {opts['queue']}", ending="\n")
                self.stdout.flush()
            consumer.run()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        if opts["verbosity"] >= 1:
            self.stdout.write(f"{consumer.deleted} deleted, {consumer.failed} failed")

    def _handler(self, path: str) -> Callable[[Any], Any]:
        try:
            handler = import_string(path)
        except ImportError as exc:
            raise CommandError(f"cannot import the handler {path!r}: {exc}") from exc
        if not callable(handler):
            raise CommandError(f"the handler {path!r} is not callable")
        return handler
