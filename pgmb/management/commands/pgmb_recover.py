"""``manage.py pgmb_recover``: requeue the dead letters of a queue that died in a window
(``pgmb.recover``)::

    manage.py pgmb_recover orders --since 2h
    manage.py pgmb_recover orders --since 2026-11-29T08:00:00Z --until 2026-11-29T09:00:00Z

``--since`` and ``--until`` (default: now) are a duration ago or an ISO-8601 time. At most
``--limit`` a call (default 10,000), oldest first; a dead letter requeued is no longer
one, so a second run requeues nothing more. Bad input is a one-line error and changes
nothing. ``pgmb_requeue`` requeues dead letters by id, or all of a queue's.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import Error as DjangoDatabaseError
from django.db import transaction
from django.utils import timezone

from pgmb import deliveries
from pgmb.cli_args import database_alias, moment, positive
from pgmb.db.error_text import database_reason, one_line


class Command(BaseCommand):
    help = "Requeue the dead letters of QUEUE that died in a window."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queue", metavar="QUEUE", help="The queue's name.")
        parser.add_argument(
            "--since", required=True, help="Start: a duration ago (2h, 1d) or an ISO-8601 time."
        )
        parser.add_argument("--until", help="End (excluded), as --since; default: now.")
        parser.add_argument(
            "--limit",
            type=positive(int),
            default=deliveries.WINDOW_LIMIT,
            help=f"At most this many dead letters (default {deliveries.WINDOW_LIMIT}).",
        )
        parser.add_argument(
            "--database", metavar="ALIAS", help="Database alias (default: PGMB['DATABASE'])."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        using = database_alias(options["database"])
        now = timezone.now()
        try:
            since = moment(options["since"], now)
            until = moment(options["until"], now) if options["until"] else now
            with transaction.atomic(using=using):
                n = deliveries.recover(
                    options["queue"], since, until, options["limit"], using=using
                )
        except ValueError as exc:
            raise CommandError(one_line(str(exc))) from exc
        except DjangoDatabaseError as exc:
            raise CommandError(f"{database_reason(exc)}; nothing changed") from exc
        if options["verbosity"] > 0:
            self.stdout.write(
                f"recovered {n} dead letter{'' if n == 1 else 's'} of queue {options['queue']}"
            )
