"""``manage.py pgmb_requeue``: requeue (or purge) dead letters of one queue.

Every dead letter of the queue, or some of them by message id (the UUID in the
dispatcher's logs and in ``pgmb.<stem>_dead_letter_queue``) or by dead-letter id (the
admin's id column)::

    manage.py pgmb_requeue order_queue --all
    manage.py pgmb_requeue order_queue --id 6f1c2a4e-... 0b9d7e31-...
    manage.py pgmb_requeue order_queue --all --purge --dry-run

Changes go through :mod:`pgmb.deliveries`, in one transaction. Bad input (an unknown
queue, an id that is not a dead letter of the queue, a malformed id) is a one-line error
and changes nothing; ``--dry-run`` says what would happen and changes nothing.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import Error as DjangoDatabaseError
from django.db import transaction
from django.db.models import QuerySet

from pgmb import deliveries
from pgmb.cli_args import database_alias
from pgmb.db.error_text import database_reason, one_line
from pgmb.management.named_rows import listed, named_rows
from pgmb.message_input import parse_id
from pgmb.models import DeadLetter, Queue

#: The most digits a dead-letter id (a bigint) has; a longer number is read as a UUID.
MAX_ID_DIGITS = 19


def parse_dead_letter_ref(text: str) -> int | uuid.UUID:
    """A dead-letter id (a whole number) or a message id (a UUID)."""
    text = text.strip()
    if text.isascii() and text.isdigit() and len(text) <= MAX_ID_DIGITS:
        return int(text)
    return parse_id(text, "--id")


def _dead_letters(n: int) -> str:
    return f"{n} dead letter{'' if n == 1 else 's'}"


class Command(BaseCommand):
    help = (
        "Requeue the dead letters of QUEUE (--all, or --id for some), or delete them "
        "(--purge). --dry-run says what would happen and changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queue", metavar="QUEUE", help="The queue's name.")
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--all", action="store_true", help="Every dead letter of the queue.")
        which.add_argument(
            "--id",
            dest="ids",
            nargs="+",
            action="extend",
            metavar="DEAD_LETTER_OR_MESSAGE_ID",
            help="Dead letters of the queue by message id (a UUID) or dead-letter id (a "
            "number, as in the admin); repeatable.",
        )
        parser.add_argument(
            "--purge",
            action="store_true",
            help="Delete the dead letters instead (their messages and attempt history stay).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Say what would happen; change nothing."
        )
        parser.add_argument(
            "--database",
            metavar="ALIAS",
            help="Database alias (default: PGMB['DATABASE']).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._handle(options)
        except ValueError as exc:
            raise CommandError(one_line(str(exc))) from exc
        except DjangoDatabaseError as exc:
            raise CommandError(f"database error: {database_reason(exc)}") from exc

    def _handle(self, options: dict[str, Any]) -> None:
        self.verbosity: int = options["verbosity"]
        using = database_alias(options["database"])
        refs = [parse_dead_letter_ref(text) for text in options["ids"] or []]
        purge, dry_run = options["purge"], options["dry_run"]
        verb = "purge" if purge else "requeue"

        with transaction.atomic(using=using):
            try:
                queue = Queue.objects.using(using).get(name=options["queue"])
            except Queue.DoesNotExist:
                raise CommandError(f"no queue named {options['queue']!r}") from None
            of_queue = DeadLetter.objects.using(using).filter(queue=queue)
            if options["all"]:
                if dry_run:
                    n = of_queue.count()
                elif purge:
                    n = deliveries.purge_queue_dead_letters(queue.name, using=using)
                else:
                    n = deliveries.requeue_queue(queue.name, using=using)
            else:
                rows = self._find(of_queue, refs, queue.name)
                if dry_run:
                    n = len(rows)
                    if self.verbosity > 1:
                        for row in rows:
                            self.stdout.write(f"{row.message_id} (dead letter {row.pk})")
                else:
                    ids = [row.pk for row in rows]
                    n = (
                        deliveries.purge_dead_letters(ids, using=using)
                        if purge
                        else deliveries.requeue(ids, using=using)
                    )
        done = "purged" if purge else "requeued"
        if dry_run:
            self._say(
                f"would {verb} {_dead_letters(n)} of queue {queue.name} (dry run: nothing changed)"
            )
        else:
            self._say(f"{done} {_dead_letters(n)} of queue {queue.name}")

    def _find(
        self, of_queue: QuerySet[DeadLetter], refs: list[int | uuid.UUID], queue: str
    ) -> list[DeadLetter]:
        """The rows ``refs`` name, locked; an error naming those that are not."""
        rows, missing = named_rows(of_queue, refs)
        if missing:
            raise CommandError(
                f"not {'a dead letter' if len(missing) == 1 else 'dead letters'} of queue "
                f"{queue}: {listed(missing)}; nothing changed"
            )
        return rows

    def _say(self, text: str) -> None:
        if self.verbosity > 0:
            self.stdout.write(text)
