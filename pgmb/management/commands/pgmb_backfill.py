"""``manage.py pgmb_backfill``: give a queue made later the stored messages its binding
matches, published in a window (``pgmb.backfill``)::

    manage.py pgmb_backfill audit --since 7d
    manage.py pgmb_backfill audit --since 2026-11-01T00:00:00Z --until 2026-11-02T00:00:00Z

``--since`` and ``--until`` (default: now) are a duration ago or an ISO-8601 time. At most
``--limit`` deliveries a call (default 10,000), oldest first; a second run adds what the
first left, and then nothing. Bad input (an unknown queue, a window that ends before it
starts) is a one-line error and changes nothing.
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
    help = (
        "Give QUEUE the stored messages of a window that its binding matches and that it "
        "never had (published before it was made)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queue", metavar="QUEUE", help="The queue's name.")
        parser.add_argument(
            "--since", required=True, help="Start: a duration ago (7d, 2h) or an ISO-8601 time."
        )
        parser.add_argument("--until", help="End (excluded), as --since; default: now.")
        parser.add_argument(
            "--limit",
            type=positive(int),
            default=deliveries.WINDOW_LIMIT,
            help=f"At most this many deliveries (default {deliveries.WINDOW_LIMIT}).",
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
                n = deliveries.backfill(
                    options["queue"], since, until, options["limit"], using=using
                )
        except ValueError as exc:
            raise CommandError(one_line(str(exc))) from exc
        except DjangoDatabaseError as exc:
            raise CommandError(f"{database_reason(exc)}; nothing changed") from exc
        if options["verbosity"] > 0:
            self.stdout.write(
                f"backfilled {n} message{'' if n == 1 else 's'} to queue {options['queue']}"
            )
