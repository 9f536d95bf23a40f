"""``manage.py pgmb_dispatch``: deliver messages to HTTP workers until stopped."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pgmb import conf
from pgmb.dispatch.database import Unavailable, conninfo_from_django
from pgmb.dispatch.engine import Dispatcher, Options
from pgmb.models import Queue


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(text) from None
        if value <= 0:
            raise ValueError(text)
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


class Command(BaseCommand):
    help = (
        "Deliver due messages to their workers' HTTP endpoints: claim, POST, ack or retry. "
        "Stops gracefully on SIGTERM/SIGINT."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        settings = conf.get()
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="NAME",
            help="Only this queue (repeatable; default: all queues).",
        )
        parser.add_argument(
            "--concurrency",
            type=_positive(int),
            default=settings.DISPATCH_CONCURRENCY,
            help="Requests in flight at most (default %(default)s).",
        )
        parser.add_argument(
            "--batch",
            type=_positive(int),
            default=settings.DISPATCH_BATCH,
            help="Deliveries claimed per query at most (default %(default)s).",
        )
        parser.add_argument(
            "--poll-interval",
            type=_positive(float),
            default=settings.DISPATCH_POLL_INTERVAL,
            help="Longest wait between polls when no notification arrives, in seconds.",
        )
        parser.add_argument(
            "--until-idle",
            action="store_true",
            help="Exit 0 once nothing is due, leased or waiting for a retry; exit 1 if the "
            "database stays unreachable for --give-up-after seconds.",
        )
        parser.add_argument(
            "--give-up-after",
            type=_positive(float),
            default=None,
            metavar="SECONDS",
            help="Exit with an error once the database has been unreachable this long "
            f"(default with --until-idle: {settings.DISPATCH_GIVE_UP:g}; otherwise never).",
        )
        parser.add_argument(
            "--max-seconds",
            type=_positive(float),
            default=None,
            help="Stop (gracefully) after this many seconds.",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        settings = conf.get()
        if opts["queues"]:
            known = set(
                Queue.objects.filter(name__in=opts["queues"]).values_list("name", flat=True)
            )
            if unknown := sorted(set(opts["queues"]) - known):
                raise CommandError(f"unknown queue(s): {', '.join(unknown)}")
        self._configure_logging(opts["verbosity"])
        options = Options(
            queues=opts["queues"],
            concurrency=opts["concurrency"],
            batch=opts["batch"],
            poll_interval=opts["poll_interval"],
            reclaim_interval=settings.DISPATCH_RECLAIM_INTERVAL,
            until_idle=opts["until_idle"],
            max_seconds=opts["max_seconds"],
            give_up_after=opts["give_up_after"]
            or (settings.DISPATCH_GIVE_UP if opts["until_idle"] else None),
            body_limit=settings.RESPONSE_BODY_LIMIT,
            heartbeat_interval=settings.DISPATCH_HEARTBEAT_INTERVAL,
        )
        dispatcher = Dispatcher(conninfo_from_django(settings.DATABASE), options)
        try:
            stats = asyncio.run(dispatcher.run())
        except Unavailable as exc:
            raise CommandError(f"gave up: the database is {exc}") from exc
        if opts["verbosity"] >= 1:
            self.stdout.write(stats.summary())

    def _configure_logging(self, verbosity: int) -> None:
        logger = logging.getLogger("pgmb.dispatch")
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            logger.addHandler(handler)
        logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))
