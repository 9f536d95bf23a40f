"""``manage.py pgmb_dispatch``: deliver messages to HTTP workers until stopped."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pgmb import conf
from pgmb.cli_args import positive
from pgmb.dispatch import process
from pgmb.process_logging import log_to_stderr


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
        try:
            aliases = process.check_aliases(opts["databases"] or [conf.get().DATABASE])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if opts["queues"]:
            unknown, unread = process.unknown_queues(aliases, opts["queues"])
            for problem in unread:
                self.stderr.write(problem)
            if unknown and not unread:
                where = "" if len(aliases) == 1 else " (in none of the databases served)"
                raise CommandError(f"unknown queue(s){where}: {', '.join(unknown)}")
        log_to_stderr(("pgmb.dispatch",), opts["verbosity"])
        options = process.options(
            opts["queues"],
            opts["concurrency"],
            opts["batch"],
            opts["poll_interval"],
            opts["until_idle"],
            opts["max_seconds"],
            opts["give_up_after"],
        )
        served = process.serve(aliases, options)
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
