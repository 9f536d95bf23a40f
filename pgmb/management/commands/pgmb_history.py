"""``manage.py pgmb_history``: the history's day partitions (pgmb.history)::

    manage.py pgmb_history premake [--days N] [--scan-limit ROWS] [--database ALIAS]
    manage.py pgmb_history retire [--older-than DAYS] [--database ALIAS]

``premake`` makes the days ahead (what the dispatcher's housekeeping and pg_cron's
``pgmb.maintenance()`` do by themselves, while each default partition holds at most
``pgmb.history_scan_limit()`` rows; ``--scan-limit`` lets an operator make them over a
bigger one, whose read holds its lock longer); ``retire`` drops each day older than
``--older-than`` (default ``PGMB['HISTORY_RETENTION_DAYS']``; without either it refuses),
keeping the unfinished messages of a day until they are finished.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, transaction

from pgmb import conf, history
from pgmb.archive_age import days_problem
from pgmb.cli_args import database_alias
from pgmb.db.error_text import first_line
from pgmb.db.statements import run


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise CommandError(f"--older-than {text!r}: must be a number of days") from None
    problem = days_problem(value)
    if problem:
        raise CommandError(f"--older-than {text!r}: {problem}")
    return value


class Command(BaseCommand):
    help = "Make the history's day partitions ahead, or retire the days older than an age."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        premake = sub.add_parser("premake", help="Make today's and the next days' partitions.")
        premake.add_argument(
            "--days",
            type=int,
            default=None,
            help="Days after today (default: PGMB['HISTORY_PREMAKE_DAYS']).",
        )
        premake.add_argument(
            "--scan-limit",
            type=int,
            default=None,
            help=(
                "Make them even if a default partition holds up to this many rows, which "
                "it reads under its lock (default: pgmb.history_scan_limit())."
            ),
        )
        retire = sub.add_parser("retire", help="Drop the days older than --older-than.")
        retire.add_argument(
            "--older-than",
            default=None,
            help="Age in days (default: PGMB['HISTORY_RETENTION_DAYS']).",
        )
        for each in (premake, retire):
            each.add_argument(
                "--database",
                default=None,
                help=f"Database alias (default: PGMB['DATABASE'], {conf.get().DATABASE!r}).",
            )

    def handle(self, *args: Any, action: str, database: str | None, **options: Any) -> None:
        alias = database_alias(database)
        try:
            with transaction.atomic(using=alias):
                if action == "premake":
                    days = options["days"]
                    if days is not None and days < 0:
                        raise CommandError(f"--days {days}: must be 0 or more")
                    limit = options["scan_limit"]
                    if limit is not None and limit < 0:
                        raise CommandError(f"--scan-limit {limit}: must be 0 or more rows")
                    made = run(history.premake_call(days, limit), using=alias)
                    self.stdout.write(f"made {made} history partition(s)")
                    if not made:
                        self._why_none(alias, limit)
                    return
                older = options["older_than"]
                if older is None:
                    older = conf.get().HISTORY_RETENTION_DAYS
                    if older is None:
                        raise CommandError(
                            "retire needs --older-than DAYS or PGMB['HISTORY_RETENTION_DAYS']"
                        )
                    days_old = float(older)
                else:
                    days_old = _days(older)
                retired = run(history.retire_call(days_old), using=alias)
        except DatabaseError as exc:
            raise CommandError(first_line(exc)) from exc
        if not retired:
            self.stdout.write(f"no day of history older than {days_old:g} days")
        for day in retired:
            self.stdout.write(day.describe())

    def _why_none(self, alias: str, limit: int | None) -> None:
        for part in run(history.defaults_call(), using=alias):
            most = part.scan_limit if limit is None else limit
            if part.rows > most:
                self.stdout.write(
                    f"{part.name} holds about {part.rows:,} row(s), over the limit of {most:,}: "
                    "premaking reads it under its lock (--scan-limit to make them anyway)"
                )
