"""``manage.py pgmb_worker``: show or set a worker's delivery controls (docs/delivery.md)::

    manage.py pgmb_worker billing                           # its controls
    manage.py pgmb_worker billing --max-in-flight 2         # at most 2 requests at once
    manage.py pgmb_worker billing --no-cap                  # no cap again
    manage.py pgmb_worker billing --rps 20 --dead-statuses 400,404,410 --retried-statuses ''

Running dispatchers and the in-database loop follow a change at their next claim.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import Error as DjangoDatabaseError

from pgmb import worker_controls
from pgmb.cli_args import database_alias
from pgmb.db.error_text import database_reason


def statuses(text: str) -> list[str]:
    """A comma-separated list as given (empty: none); the database judges its entries."""
    return [entry for entry in text.split(",") if entry.strip()] if text.strip() else []


class Command(BaseCommand):
    help = "Show or set a worker's rate, cap on requests in flight and final answers."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("worker")
        cap = parser.add_mutually_exclusive_group()
        cap.add_argument(
            "--max-in-flight", type=int, help="Requests in flight at most, across dispatchers."
        )
        cap.add_argument("--no-cap", action="store_true", help="Lift the cap.")
        parser.add_argument("--rps", type=int, help="Requests a second at most.")
        parser.add_argument(
            "--dead-statuses",
            type=statuses,
            help="Statuses or classes that dead-letter at once, comma-separated ('': none).",
        )
        parser.add_argument(
            "--retried-statuses",
            type=statuses,
            help="Statuses retried although a class above names them ('': none).",
        )
        parser.add_argument(
            "--database", metavar="ALIAS", help="Database alias (default: PGMB['DATABASE'])."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        using = database_alias(options["database"])
        changes: dict[str, Any] = {
            field: options[field]
            for field in ("rps", "max_in_flight", "dead_statuses", "retried_statuses")
            if options[field] is not None
        }
        if options["no_cap"]:
            changes["max_in_flight"] = None
        name = options["worker"]
        try:
            shown = worker_controls.set_controls(name, using=using, **changes)
        except DjangoDatabaseError as exc:
            raise CommandError(f"database error: {database_reason(exc)}") from exc
        if shown is None:
            raise CommandError(f"no worker named {name!r}")
        cap = "no cap" if shown.max_in_flight is None else f"at most {shown.max_in_flight}"
        self.stdout.write(
            f"worker {shown.name}: {shown.rps} requests a second, in flight {cap}\n"
            f"  dead-lettered at once: {', '.join(shown.dead_statuses) or '-'}\n"
            f"  retried all the same: {', '.join(shown.retried_statuses) or '-'}"
        )
