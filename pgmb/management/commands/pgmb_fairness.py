"""``manage.py pgmb_fairness``: a queue's fair shares per key (docs/fairness.md)::

manage.py pgmb_fairness orders                          # the header and the keys
manage.py pgmb_fairness orders --header tenant          # take tenants in turn
manage.py pgmb_fairness orders --off                    # oldest first again
manage.py pgmb_fairness orders --key acme --weight 2 --max-in-flight 4 --rps 10
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import Error as DjangoDatabaseError
from django.db import transaction

from pgmb import fairness
from pgmb.cli_args import database_alias
from pgmb.db.error_text import database_reason


class Command(BaseCommand):
    help = "Show or set a queue's fairness header and its keys' weight, cap and rate."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queue")
        header = parser.add_mutually_exclusive_group()
        header.add_argument("--header", help="The header whose values are taken in turn.")
        header.add_argument("--off", action="store_true", help="Oldest first again.")
        parser.add_argument("--key", help="A key to set (every setting: unset ones lifted).")
        parser.add_argument("--weight", type=int, default=1)
        parser.add_argument("--max-in-flight", type=int, default=None)
        parser.add_argument("--rps", type=float, default=None)
        parser.add_argument(
            "--database", metavar="ALIAS", help="Database alias (default: PGMB['DATABASE'])."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        using = database_alias(options["database"])
        queue = options["queue"]
        try:
            with transaction.atomic(using=using):
                if options["header"] is not None or options["off"]:
                    fairness.set_header(queue, options["header"], using=using)
                if options["key"] is not None:
                    fairness.set_key(
                        queue,
                        options["key"],
                        weight=options["weight"],
                        max_in_flight=options["max_in_flight"],
                        rps=options["rps"],
                        using=using,
                    )
                shares = fairness.shares(queue, using=using)
        except DjangoDatabaseError as exc:
            raise CommandError(f"database error: {database_reason(exc)}") from exc
        if shares is None:
            raise CommandError(f"no queue named {queue!r}")
        if shares.header is None:
            self.stdout.write(f"queue {queue}: oldest first (no fairness header)")
        else:
            self.stdout.write(f"queue {queue}: keys of header {shares.header!r} in turn")
        for k in shares.keys:
            cap = "-" if k.max_in_flight is None else k.max_in_flight
            rps = "-" if k.rps is None else f"{k.rps:g}"
            self.stdout.write(f"  {k.key!r}: weight {k.weight}, in flight at most {cap}, rps {rps}")
