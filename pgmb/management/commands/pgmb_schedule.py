"""``manage.py pgmb_schedule``: list, add, pause, resume and remove schedules
(docs/schedules.md)::

    manage.py pgmb_schedule list
    manage.py pgmb_schedule add nightly-report --cron "30 2 * * *" --timezone Europe/Berlin \\
        --routing-key report.nightly --body '{"kind": "daily"}'
    manage.py pgmb_schedule add heartbeat --every 10 --routing-key ops.heartbeat
    manage.py pgmb_schedule pause nightly-report
    manage.py pgmb_schedule resume nightly-report
    manage.py pgmb_schedule remove nightly-report

Thin: each subcommand is one call of :mod:`pgmb.schedules`, whose checks (and the
database's) make bad input a one-line error that stores nothing.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import Error as DjangoDatabaseError
from django.db import transaction

from pgmb import schedules
from pgmb.cli_args import database_alias
from pgmb.db.error_text import database_reason, one_line
from pgmb.errors import InvalidSchedule
from pgmb.models import Schedule


class Command(BaseCommand):
    help = "List, add (or change), pause, resume and remove schedules."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database", metavar="ALIAS", help="Database alias (default: PGMB['DATABASE'])."
        )
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="Every schedule, its next run and its last run.")
        add = sub.add_parser("add", help="Add a schedule, or change the one of that name.")
        add.add_argument("name")
        when = add.add_mutually_exclusive_group(required=True)
        when.add_argument("--cron", help='A 5-field cron expression, such as "30 2 * * *".')
        when.add_argument("--every", type=float, help="An interval in seconds (at least 1).")
        add.add_argument(
            "--timezone", default="UTC", help="IANA time zone of --cron (default UTC)."
        )
        add.add_argument("--routing-key", required=True)
        add.add_argument("--body", default="{}", help="The message body, JSON (default {}).")
        add.add_argument("--headers", default=None, help="The message headers, a JSON object.")
        add.add_argument(
            "--missed",
            choices=schedules.MISSED,
            default="once",
            help="Runs missed while nothing fired: skip, once (default) or all.",
        )
        for name in ("pause", "resume", "remove"):
            sub.add_parser(name).add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        using = database_alias(options["database"])
        action = options["action"]
        try:
            with transaction.atomic(using=using):
                if action == "list":
                    self._list(using)
                elif action == "add":
                    self._add(options, using)
                else:
                    call = {
                        "pause": schedules.pause,
                        "resume": schedules.resume,
                        "remove": schedules.unschedule,
                    }[action]
                    if not call(options["name"], using=using):
                        raise CommandError(f'no schedule named "{options["name"]}"')
                    self.stdout.write(
                        f"{action}d {options['name']}"
                        if action != "remove"
                        else f"removed {options['name']}"
                    )
        except InvalidSchedule as exc:
            raise CommandError(one_line(str(exc))) from None
        except DjangoDatabaseError as exc:
            raise CommandError(database_reason(exc)) from None

    def _add(self, options: dict[str, Any], using: str) -> None:
        try:
            body = json.loads(options["body"])
            headers = None if options["headers"] is None else json.loads(options["headers"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"--body and --headers are JSON: {exc}") from None
        schedules.schedule(
            options["name"],
            options["routing_key"],
            body,
            cron=options["cron"],
            every=options["every"],
            timezone=options["timezone"],
            headers=headers,
            missed=options["missed"],
            using=using,
        )
        s = Schedule.objects.using(using).get(name=options["name"])
        self.stdout.write(f"scheduled {s.name}: next run {s.next_run_at.isoformat()}")

    def _list(self, using: str) -> None:
        for s in Schedule.objects.using(using).order_by("name"):
            when = schedules.describe(s.cron, s.timezone, s.every)
            last = s.last_runs[0].isoformat() if s.last_runs else "never"
            state = "paused" if s.paused else "running"
            self.stdout.write(
                f"{s.name}\t{state}\t{when}\t{s.routing_key}\tnext {s.next_run_at.isoformat()}"
                f"\tlast {last}\truns {s.runs}"
            )
