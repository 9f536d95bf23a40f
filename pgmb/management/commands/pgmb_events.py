"""``manage.py pgmb_events``: turn pgmb's operational events on or off, or say whether
they are on (docs/operations.md, Events)::

    manage.py pgmb_events on
    manage.py pgmb_events status

The switch is a row of the database: running dispatchers follow it at once.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import Error as DjangoDatabaseError

from pgmb import events
from pgmb.cli_args import database_alias
from pgmb.db.error_text import database_reason


class Command(BaseCommand):
    help = "Turn pgmb's operational events (routing keys pgmb.*) on or off, or show the state."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("state", choices=["on", "off", "status"])
        parser.add_argument(
            "--database", metavar="ALIAS", help="Database alias (default: PGMB['DATABASE'])."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        using = database_alias(options["database"])
        try:
            if options["state"] == "status":
                on = events.enabled(using=using)
            else:
                on = events.set_enabled(options["state"] == "on", using=using)
        except DjangoDatabaseError as exc:
            raise CommandError(f"database error: {database_reason(exc)}") from exc
        self.stdout.write(f"events are {'on' if on else 'off'}")
