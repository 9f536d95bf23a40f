"""What ``manage.py pgmb_backfill`` and ``pgmb_recover`` share: a queue, a window of time
(``--since``, ``--until``: a duration ago or an ISO-8601 time), a limit a call, one
transaction, and a one-line refusal that changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import Error as DjangoDatabaseError
from django.db import transaction
from django.utils import timezone

from pgmb import deliveries
from pgmb.cli_args import database_alias, moment, positive
from pgmb.db.error_text import database_reason, one_line


class WindowCommand(BaseCommand):
    #: The call: (queue, since, until, limit, using=) -> how many.
    action: ClassVar[Callable[..., int]]
    #: What it counts, one and many ("dead letter", "dead letters").
    things: ClassVar[tuple[str, str]]
    #: The report: "{n}", "{things}" and "{queue}" filled in.
    report: ClassVar[str]
    since_example: ClassVar[str] = "2h, 1d"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queue", metavar="QUEUE", help="The queue's name.")
        parser.add_argument(
            "--since",
            required=True,
            help=f"Start: a duration ago ({self.since_example}) or an ISO-8601 time.",
        )
        parser.add_argument("--until", help="End (excluded), as --since; default: now.")
        parser.add_argument(
            "--limit",
            type=positive(int),
            default=deliveries.WINDOW_LIMIT,
            help=f"At most this many {self.things[1]} (default {deliveries.WINDOW_LIMIT}).",
        )
        parser.add_argument(
            "--database", metavar="ALIAS", help="Database alias (default: PGMB['DATABASE'])."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        using = database_alias(options["database"])
        now = timezone.now()
        try:
            since: datetime = moment(options["since"], now)
            until: datetime = moment(options["until"], now) if options["until"] else now
            with transaction.atomic(using=using):
                n = type(self).action(options["queue"], since, until, options["limit"], using=using)
        except ValueError as exc:
            raise CommandError(one_line(str(exc))) from exc
        except DjangoDatabaseError as exc:
            raise CommandError(f"{database_reason(exc)}; nothing changed") from exc
        if options["verbosity"] > 0:
            things = self.things[0] if n == 1 else self.things[1]
            self.stdout.write(self.report.format(n=n, things=things, queue=options["queue"]))
