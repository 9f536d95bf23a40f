"""``manage.py pgmb_dispatch``: deliver messages to HTTP workers until stopped."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections
from django.utils.connection import ConnectionDoesNotExist

from pgmb import conf
from pgmb.cli_args import positive
from pgmb.db.conninfo import conninfo_from_django
from pgmb.db.error_text import database_reason
from pgmb.dispatch import gc_tuning
from pgmb.dispatch.engine import Options
from pgmb.dispatch.supervisor import Supervisor
from pgmb.housekeeping import Thresholds
from pgmb.models import Queue


class Command(BaseCommand):
    help = (
        "Deliver due messages to their workers' HTTP endpoints: claim, POST, ack or retry. "
        "Stops gracefully on SIGTERM/SIGINT."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        settings = conf.get()
        parser.add_argument(
            "--database",
            action="append",
            dest="databases",
            metavar="ALIAS",
            help="Serve this database alias of settings.DATABASES (repeatable: one process, "
            "one dispatcher per database; default: PGMB['DATABASE'], "
            f"{settings.DATABASE!r}).",
        )
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="NAME",
            help="Only this queue (repeatable; default: all queues).",
        )
        parser.add_argument(
            "--concurrency",
            type=positive(int),
            default=settings.DISPATCH_CONCURRENCY,
            help="Requests in flight at most (default %(default)s).",
        )
        parser.add_argument(
            "--batch",
            type=positive(int),
            default=settings.DISPATCH_BATCH,
            help="Deliveries claimed per query at most (default %(default)s).",
        )
        parser.add_argument(
            "--poll-interval",
            type=positive(float),
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
            type=positive(float),
            default=None,
            metavar="SECONDS",
            help="Exit with an error once the database has been unreachable this long "
            f"(default with --until-idle: {settings.DISPATCH_GIVE_UP:g}; otherwise never).",
        )
        parser.add_argument(
            "--max-seconds",
            type=positive(float),
            default=None,
            help="Stop (gracefully) after this many seconds.",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        settings = conf.get()
        aliases = self._aliases(opts["databases"] or [settings.DATABASE])
        if opts["queues"]:
            self._check_queues(aliases, opts["queues"])
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
            housekeeping_interval=settings.HOUSEKEEPING_INTERVAL,
            housekeeping_thresholds=Thresholds.from_settings(),
            vacuum_every=settings.HOUSEKEEPING_VACUUM_EVERY,
        )
        supervisor = Supervisor({alias: conninfo_from_django(alias) for alias in aliases}, options)
        frozen = gc_tuning.settle()
        logging.getLogger("pgmb.dispatch").debug(
            "heap settled: %d objects frozen, young collections every %d allocations",
            frozen,
            gc_tuning.YOUNG_THRESHOLD,
        )
        served = asyncio.run(supervisor.run())
        if opts["verbosity"] >= 1:
            for alias, result in served.items():
                prefix = f"database={alias} " if len(served) > 1 else ""
                self.stdout.write(prefix + result.stats.summary())
        gave_up = [result for result in served.values() if result.gave_up]
        if len(served) == 1 and gave_up:
            raise CommandError(f"gave up: the database {gave_up[0].gave_up}")
        if gave_up:
            raise CommandError(
                "gave up: "
                + "; ".join(f"database {result.alias!r} {result.gave_up}" for result in gave_up)
            )

    def _aliases(self, given: list[str]) -> list[str]:
        """The aliases to serve, in order; an error for anything pgmb cannot serve."""
        for alias in given:
            try:
                vendor = connections[alias].vendor
            except ConnectionDoesNotExist:
                raise CommandError(f"--database {alias!r} is not in settings.DATABASES") from None
            if vendor != "postgresql":
                raise CommandError(
                    f"--database {alias!r} is {vendor}, not PostgreSQL: pgmb needs "
                    "django.db.backends.postgresql"
                )
        if twice := sorted({alias for alias in given if given.count(alias) > 1}):
            raise CommandError(f"--database given twice: {', '.join(map(repr, twice))}")
        return given

    def _check_queues(self, aliases: list[str], names: list[str]) -> None:
        """Each ``--queue`` must exist in at least one of the databases served.

        A database that cannot be read now (unreachable, not migrated) is that database's
        problem, as it is once dispatching: a warning, and its queues are not counted.
        """
        known: set[str] = set()
        unread = []
        for alias in aliases:
            try:
                known.update(
                    Queue.objects.using(alias).filter(name__in=names).values_list("name", flat=True)
                )
            except DatabaseError as exc:
                unread.append(alias)
                self.stderr.write(
                    f"could not read the queues of database {alias!r}: {database_reason(exc)}"
                )
            finally:
                # The dispatcher has connections of its own; this one would only idle.
                connections[alias].close()
        unknown = sorted(set(names) - known)
        if unknown and not unread:
            where = "" if len(aliases) == 1 else " (in none of the databases served)"
            raise CommandError(f"unknown queue(s){where}: {', '.join(unknown)}")

    def _configure_logging(self, verbosity: int) -> None:
        logger = logging.getLogger("pgmb.dispatch")
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            logger.addHandler(handler)
        logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))
