"""``manage.py pgmb_adopt_extension``: a database that ``CREATE EXTENSION pgmb`` set up,
handed over to Django's migrations (:func:`pgmb.extension.adopt`, docs/extension.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import extension


class Command(BaseCommand):
    help = (
        "Make a database that CREATE EXTENSION pgmb set up one that migrate manages: its "
        "objects leave the extension unchanged, its release migrations are recorded as applied."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=None, help="the database alias")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            version = extension.adopt(using=options["database"])
        except extension.NotAdoptable as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"adopted pgmb {version}: its objects are the database's, its release migrations "
            "recorded as applied; run manage.py migrate for the later ones"
        )
