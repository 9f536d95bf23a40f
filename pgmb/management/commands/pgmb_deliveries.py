"""``manage.py pgmb_deliveries``: cancel live deliveries of a queue, or make them due now.

Some by delivery id (the admin's id column) or message id, or every one that matches
filters (a routing-key prefix, an age), or all of them::

    manage.py pgmb_deliveries cancel order_queue --id 1234 6f1c2a4e-...
    manage.py pgmb_deliveries cancel order_queue --routing-key-prefix order.test. --older-than 1d
    manage.py pgmb_deliveries run-now order_queue --all --dry-run

A cancelled delivery is never posted again; one in flight (leased) is ended by its
request's outcome, recorded as 'canceled' (docs/decisions/0084-cancel-and-run-now.md).
Changes go through :mod:`pgmb.deliveries`, in one transaction. Ids that are not live
deliveries of the queue (unknown, finished, or already cancelled in flight) are a one-line
error naming them, and nothing changes; ``--dry-run`` says what would happen.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import Error as DjangoDatabaseError
from django.db import transaction
from django.db.models import QuerySet

from pgmb import deliveries
from pgmb.cli_args import database_alias
from pgmb.db.error_text import database_reason, one_line
from pgmb.durations import parse_delay
from pgmb.management.named_rows import listed, named_rows
from pgmb.models import Delivery, Queue

from .pgmb_requeue import parse_dead_letter_ref

CANCEL, RUN_NOW = "cancel", "run-now"


def _deliveries(n: int) -> str:
    return f"{n} deliver{'y' if n == 1 else 'ies'}"


def _age(text: str) -> timedelta:
    seconds = parse_delay(text)
    if isinstance(seconds, datetime):
        raise ValueError(f"--older-than takes a duration (like 30m or 1d), not a time: {text!r}")
    return timedelta(seconds=seconds)


class Command(BaseCommand):
    help = (
        "Cancel the live deliveries of QUEUE (never posted again), or make them due now "
        "(run-now): --id for some, --routing-key-prefix and --older-than to match, or --all. "
        "--dry-run says what would happen and changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("what", choices=[CANCEL, RUN_NOW], help="What to do.")
        parser.add_argument("queue", metavar="QUEUE", help="The queue's name.")
        parser.add_argument(
            "--id",
            dest="ids",
            nargs="+",
            action="extend",
            metavar="DELIVERY_OR_MESSAGE_ID",
            help="Live deliveries of the queue by delivery id (a number, as in the admin) or "
            "message id (a UUID); repeatable.",
        )
        parser.add_argument(
            "--routing-key-prefix",
            metavar="PREFIX",
            help="Those whose message's routing key begins with PREFIX (case-sensitive).",
        )
        parser.add_argument(
            "--older-than",
            metavar="DURATION",
            type=_age,
            help="Those created at least this long ago (30, 10m, 2h, 1d).",
        )
        parser.add_argument("--all", action="store_true", help="Every live delivery of QUEUE.")
        parser.add_argument(
            "--dry-run", action="store_true", help="Say what would happen; change nothing."
        )
        parser.add_argument(
            "--database", metavar="ALIAS", help="Database alias (default: PGMB['DATABASE'])."
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
        what, dry_run = options["what"], options["dry_run"]
        prefix, older_than = options["routing_key_prefix"], options["older_than"]
        refs = [parse_dead_letter_ref(text) for text in options["ids"] or []]
        filtered = prefix is not None or older_than is not None
        if sum([bool(refs), filtered, options["all"]]) != 1:
            raise CommandError(
                "say which deliveries: --id, or --routing-key-prefix and/or --older-than, "
                "or --all (one of the three)"
            )
        with transaction.atomic(using=using):
            try:
                queue = Queue.objects.using(using).get(name=options["queue"])
            except Queue.DoesNotExist:
                raise CommandError(f"no queue named {options['queue']!r}") from None
            if refs:
                live = Delivery.objects.using(using).filter(queue=queue, canceled_at__isnull=True)
                ids = [row.pk for row in self._find(live, refs, queue.name)]
            # A dry run does it and rolls back: its counts are the real ones.
            if what == CANCEL:
                canceled = (
                    deliveries.cancel(ids, using=using)
                    if refs
                    else deliveries.cancel_matching(queue.name, prefix, older_than, using=using)
                )
                text = f"cancelled {_deliveries(canceled.total)} of queue {queue.name}"
                if canceled.in_flight:
                    text += (
                        f" ({canceled.in_flight} in flight: each ends when its request's "
                        "outcome comes)"
                    )
            else:
                made = (
                    deliveries.run_now(ids, using=using)
                    if refs
                    else deliveries.run_now_matching(queue.name, prefix, older_than, using=using)
                )
                text = f"made {_deliveries(made.total)} of queue {queue.name} due now"
                if made.waiting:
                    text += (
                        f" ({made.waiting} waiting: each stays behind its group or "
                        "dependencies until they settle)"
                    )
            if dry_run:
                transaction.set_rollback(True, using=using)
                text = f"would have {text} (dry run: nothing changed)"
        self._say(text)

    def _find(
        self, live: QuerySet[Delivery], refs: list[int | uuid.UUID], queue: str
    ) -> list[Delivery]:
        """The rows ``refs`` name, locked; an error naming those that are not."""
        rows, missing = named_rows(live, refs)
        if missing:
            raise CommandError(
                f"not {'a live delivery' if len(missing) == 1 else 'live deliveries'} of queue "
                f"{queue} (unknown, finished or already cancelled): {listed(missing)}; "
                "nothing changed"
            )
        return rows

    def _say(self, text: str) -> None:
        if self.verbosity > 0:
            self.stdout.write(text)
