"""``manage.py pgmb_trace_export``: make spans of the in-database loop's attempts, which
the loop records in the history but cannot send to OpenTelemetry itself (docs/tracing.md)::

    opentelemetry-instrument python manage.py pgmb_trace_export --follow

Each attempt is exported once, whoever runs the command and however often: where the
export stands is kept in the database.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from pgmb import trace_export
from pgmb.cli_args import database_alias, not_negative, positive
from pgmb.db.error_text import database_reason


class Command(BaseCommand):
    help = (
        "Make an OpenTelemetry span of each attempt the in-database loop made of a traced "
        "message, once (needs pgmb[otel], an SDK and an exporter in this process). Stops on "
        "SIGTERM/SIGINT."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--follow",
            action="store_true",
            help="Keep exporting new attempts until stopped (default: export those recorded "
            "so far and exit).",
        )
        parser.add_argument(
            "--interval",
            type=positive(float),
            default=5.0,
            help="With --follow, seconds between reads once caught up (default %(default)s).",
        )
        parser.add_argument(
            "--lag",
            type=not_negative,
            default=trace_export.DEFAULT_LAG,
            help="Export an attempt this many seconds after it was recorded, once its "
            "outcome is surely committed (default %(default)s).",
        )
        parser.add_argument(
            "--batch",
            type=positive(int),
            default=trace_export.DEFAULT_BATCH,
            help="Attempts read per transaction (default %(default)s).",
        )
        parser.add_argument(
            "--database", metavar="ALIAS", help="Database alias (default: PGMB['DATABASE'])."
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        using = database_alias(opts["database"])
        try:
            trace_export.check_recording()
        except trace_export.TracingUnavailable as exc:
            raise CommandError(f"pgmb_trace_export cannot make spans: {exc}") from exc
        stopped = threading.Event()

        def stop(signum: int, frame: Any) -> None:
            stopped.set()

        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        read = spans = 0
        try:
            while not stopped.is_set():
                try:
                    done = trace_export.export(batch=opts["batch"], lag=opts["lag"], using=using)
                except DatabaseError as exc:
                    if not opts["follow"]:
                        raise CommandError(f"database error: {database_reason(exc)}") from exc
                    # Following, a fault is a pause: the batch was not exported, and is
                    # read again on a new connection.
                    self.stderr.write(f"database error, retrying: {database_reason(exc)}")
                    connections[using].close()
                else:
                    read += done.read
                    spans += done.spans
                    if not opts["follow"]:
                        break
                stopped.wait(opts["interval"])
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        if opts["verbosity"] >= 1:
            self.stdout.write(f"{spans} spans made of {read} attempts of the in-database loop")
