"""``manage.py pgmb_cron install|uninstall|status``: the in-database dispatcher's pg_cron jobs."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections, transaction

from pgmb import checks, conf, indb, sql
from pgmb.db.error_text import first_line


class Command(BaseCommand):
    help = (
        "Manage the pg_cron jobs of the in-database dispatcher: install (load the PL/Python "
        "transport where it is missing or older and this role may; then schedule the jobs, "
        "but not as a superuser other than pgmb's owner, creating the pg_cron extension "
        "here if it is preloaded for this database), uninstall, or status (pg_cron "
        "version, jobs, recent runs, HTTP transport)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["install", "uninstall", "status"])
        parser.add_argument(
            "--batch",
            type=int,
            default=indb.DEFAULT_BATCH,
            help="Deliveries claimed per loop (install).",
        )

    def handle(self, *args: Any, action: str, batch: int, **options: Any) -> None:
        steps = (
            (self.load_transport, self.install) if action == "install" else (getattr(self, action),)
        )
        for step in steps:  # each its own transaction: what one did stays if the next fails
            self.run(step, batch)

    def run(self, step: Any, batch: int) -> None:
        alias = conf.get().DATABASE
        try:
            with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
                step(cursor, batch)
        except DatabaseError as exc:
            cause = exc.__cause__ or exc
            hint = getattr(getattr(cause, "diag", None), "message_hint", None)
            raise CommandError(first_line(cause) + (f" ({hint})" if hint else "")) from exc

    def load_transport(self, cursor: Any, batch: int) -> None:
        """Store the endpoint policy, and load (or bring up to date) the PL/Python transport
        where the database has no transport or an older one: a superuser's to do, as
        plpython3u is untrusted; a role that may not is told what a DBA runs."""
        indb.write_endpoint_policy(cursor)
        caps = indb.capabilities(cursor)
        plpython = indb.plpython_transport_state(cursor)
        if caps.transport is not None and plpython != "outdated":
            return
        if indb.install_plpython_transport(cursor):
            self.stdout.write("loaded the PL/Python transport")
        elif plpython == "outdated":
            self.stderr.write(
                f"warning: pgmb's PL/Python transport here is another version's, and role "
                f"{caps.role} may not replace it. A DBA (a superuser) runs in database "
                f"{caps.database!r} {indb.LOAD_PLPYTHON}."
            )
        elif caps.plpython_installed or caps.plpython_available:
            self.stderr.write(f"warning: no HTTP transport here. {indb.transport_statements(caps)}")

    def install(self, cursor: Any, batch: int) -> None:
        caps = indb.capabilities(cursor)
        if caps.superuser and caps.pgmb_owner != caps.role:
            # pg_cron runs a job as the role that scheduled it: not as a DBA's superuser.
            self.stdout.write(
                "scheduled no job: pg_cron runs a job as the role that scheduled it, a "
                f"superuser here; as {caps.pgmb_owner}, pgmb's owner, run 'manage.py "
                "pgmb_cron install'"
            )
            return
        if caps.pg_cron_version is None:
            self.create_pg_cron(cursor, caps)
            caps = indb.capabilities(cursor)
        if problems := checks.pg_cron_warnings(caps):  # pg_cron here, but not for this role
            raise CommandError(f"{problems[0].msg} {problems[0].hint}")
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

    def create_pg_cron(self, cursor: Any, caps: indb.Capabilities) -> None:
        """CREATE EXTENSION pg_cron where it is preloaded for this database, or where this
        role may not read whether it is (pg_cron's own script then says); else, and when
        this role may not create it, an error that says what a DBA runs."""
        if (
            not caps.pg_cron_available
            or caps.pg_cron_preloaded is False
            or (caps.pg_cron_preloaded and caps.pg_cron_database != caps.database)
        ):
            problem = checks.pg_cron_warnings(caps)[0]
            raise CommandError(f"{problem.msg} {problem.hint}")
        try:
            cursor.execute(sql.query("indb.sql", "create_pg_cron"))
        except DatabaseError as exc:
            raise CommandError(
                f"pg_cron could not be created in database {caps.database!r} "
                f"({first_line(exc.__cause__ or exc)}). {indb.pg_cron_statements(caps)}"
            ) from exc

    def uninstall(self, cursor: Any, batch: int) -> None:
        cursor.execute("SELECT pgmb.cron_uninstall()")
        self.stdout.write(f"unscheduled {cursor.fetchone()[0]} job(s)")

    def status(self, cursor: Any, batch: int) -> None:
        caps = indb.capabilities(cursor)
        write = self.stdout.write
        unreadable = f"unknown (role {caps.role} may not read it: pg_read_all_settings)"
        write(f"database: {caps.database}")
        write(f"pg_cron available on the server: {'yes' if caps.pg_cron_available else 'no'}")
        write(
            "pg_cron preloaded: "
            + {True: "yes", False: "no", None: unreadable}[caps.pg_cron_preloaded]
        )
        write(
            "pg_cron database (cron.database_name): "
            + (caps.pg_cron_database or ("-" if caps.settings_readable else unreadable))
        )
        write(f"pg_cron version here: {caps.pg_cron_version or 'not installed'}")
        if caps.pg_cron_version is not None:
            write(f"schema cron usable by {caps.role}: {'yes' if caps.pg_cron_usable else 'no'}")
        write(f"HTTP transport: {caps.transport or 'none (install http or plpython3u)'}")
        state = indb.plpython_transport_state(cursor)
        plpython = {
            "current": "this version's",
            "outdated": "another version's",
            "absent": "not loaded",
        }[state]
        if state != "current" and not caps.plpython_loadable and caps.plpython_available:
            plpython += (
                f" (role {caps.role} may not load it: a superuser runs {indb.LOAD_PLPYTHON})"
            )
        write(f"PL/Python transport: {plpython}")
        for problem in checks.pg_cron_warnings(caps):
            write(f"to do: {problem.hint}")
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
