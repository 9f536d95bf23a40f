"""``manage.py pgmb_housekeeping``: rebuild pgmb_delivery's indexes left large by a backlog.

What ``manage.py pgmb_dispatch`` does by itself once it has drained work
(:mod:`pgmb.housekeeping`), for operators and for deployments that dispatch from pg_cron
(run it from the system's cron: pg_cron runs SQL, and ``REINDEX ... CONCURRENTLY`` needs a
decision first and a statement of its own)::

    manage.py pgmb_housekeeping [--dry-run] [--database ALIAS]

Exits 1 when a step failed (the report says which and why), 0 otherwise, also when another
process was doing it.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.core.management.base import BaseCommand, CommandError, CommandParser

from pgmb import conf, housekeeping
from pgmb.cli_args import database_alias
from pgmb.db.error_text import first_line


class Command(BaseCommand):
    help = (
        "Rebuild (REINDEX CONCURRENTLY) the indexes of pgmb_delivery that are larger than "
        "PGMB['HOUSEKEEPING_MIN_INDEX_BYTES'] and PGMB['HOUSEKEEPING_BLOAT_FACTOR'] times "
        "what its live rows need, after dropping what an interrupted rebuild left."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="Say what would be done; do nothing."
        )
        parser.add_argument(
            "--database",
            default=None,
            help=f"Database alias (default: PGMB['DATABASE'], {conf.get().DATABASE!r}).",
        )

    def handle(self, *args: Any, dry_run: bool, database: str | None, **options: Any) -> None:
        alias = database_alias(database)
        try:
            report = housekeeping.housekeep(alias, dry_run=dry_run)
        except psycopg.Error as exc:
            raise CommandError(first_line(exc)) from exc
        except housekeeping.ThroughPooler as exc:
            raise CommandError(str(exc)) from exc
        if not report.ran:
            self.stdout.write("another process is doing housekeeping: nothing done")
            return
        self.stdout.write(f"pgmb_delivery: {report.live_rows:,} live rows (statistics)")
        if not report.steps:
            self.stdout.write("no index to rebuild")
        for step in report.steps:
            self.stdout.write(step.describe())
        if report.failed:
            raise CommandError(f"{len(report.failed)} step(s) failed; see above")
