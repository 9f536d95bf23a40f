"""``manage.py pgmb_cron install|uninstall|status``: the in-database dispatcher's pg_cron jobs."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections, transaction

from pgmb import conf, indb, sql
from pgmb.db.error_text import first_line


class Command(BaseCommand):
    help = (
        "Manage the pg_cron jobs of the in-database dispatcher: install (schedule them, "
        "creating the pg_cron extension here if it is preloaded for this database), "
        "uninstall, or status (pg_cron version, jobs, recent runs, HTTP transport)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["install", "uninstall", "status"])
        parser.add_argument(
            "--batch", type=int, default=50, help="Deliveries claimed per loop (install)."
        )

    def handle(self, *args: Any, action: str, batch: int, **options: Any) -> None:
        alias = conf.get().DATABASE
        try:
            with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
                getattr(self, action)(cursor, batch)
        except DatabaseError as exc:
            cause = exc.__cause__ or exc
            hint = getattr(getattr(cause, "diag", None), "message_hint", None)
            raise CommandError(first_line(cause) + (f" ({hint})" if hint else "")) from exc

    def install(self, cursor: Any, batch: int) -> None:
        indb.write_endpoint_policy(cursor)
        caps = indb.capabilities(cursor)
        if caps.transport is None:
            indb.install_plpython_transport(cursor)
        if caps.pg_cron_version is None:
            if not caps.pg_cron_preloaded:
                raise CommandError(
                    "pg_cron is not preloaded: add shared_preload_libraries = 'pg_cron' and "
                    f"cron.database_name = '{caps.database}' to postgresql.conf, then restart"
                )
            if caps.pg_cron_database != caps.database:
                raise CommandError(
                    f"pg_cron serves database {caps.pg_cron_database!r}, not {caps.database!r}: "
                    f"set cron.database_name = '{caps.database}' and restart PostgreSQL"
                )
            cursor.execute(sql.query("indb.sql", "create_pg_cron"))
        cursor.execute("SELECT pgmb.cron_install(%s)", (batch,))
        self.stdout.write(f"scheduled {cursor.fetchone()[0]}")
        transport = indb.capabilities(cursor).transport
        if transport is None:
            self.stderr.write(
                "warning: no HTTP transport in this database (install the http extension or "
                "plpython3u): the job will fail until one exists"
            )
        else:
            self.stdout.write(f"HTTP transport: {transport}")

    def uninstall(self, cursor: Any, batch: int) -> None:
        cursor.execute("SELECT pgmb.cron_uninstall()")
        self.stdout.write(f"unscheduled {cursor.fetchone()[0]} job(s)")

    def status(self, cursor: Any, batch: int) -> None:
        caps = indb.capabilities(cursor)
        write = self.stdout.write
        write(f"database: {caps.database}")
        write(f"pg_cron preloaded: {'yes' if caps.pg_cron_preloaded else 'no'}")
        write(f"pg_cron database (cron.database_name): {caps.pg_cron_database or '-'}")
        write(f"pg_cron version here: {caps.pg_cron_version or 'not installed'}")
        write(f"HTTP transport: {caps.transport or 'none (install http or plpython3u)'}")
        if caps.pg_cron_version is None:
            return
        cursor.execute(sql.query("indb.sql", "cron_jobs"))
        jobs = cursor.fetchall()
        write("jobs:" if jobs else "jobs: none (run: manage.py pgmb_cron install)")
        for jobid, name, schedule, command, active in jobs:
            write(f"  #{jobid} {name} [{schedule}] {'active' if active else 'inactive'}: {command}")
        cursor.execute(sql.query("indb.sql", "cron_runs"))
        runs = cursor.fetchall()
        if runs:
            write("recent runs:")
        for name, status, start, end, message in runs:
            took = end - start if end else "(running)"
            write(f"  {start:%Y-%m-%d %H:%M:%S} {name} {status} {took} {message or ''}")
