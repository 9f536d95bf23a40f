"""System checks: misconfiguration is reported by ``manage.py check``, not at run time."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import connections

from . import access, conf, indb


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    problems = [
        Error(text, hint="See docs/configuration.md in pgmb's repository.", id="pgmb.E001")
        for text in conf.errors(getattr(settings, "PGMB", {}))
    ]
    if not apps.is_installed("pgtrigger"):
        problems.append(
            Error(
                "pgmb needs django-pgtrigger: its routing trigger is installed by migrations.",
                hint="Add 'pgtrigger' to INSTALLED_APPS.",
                id="pgmb.E002",
            )
        )
    if problems:
        return problems
    alias = conf.get().DATABASE
    if alias not in settings.DATABASES:
        return [
            Error(
                f"PGMB['DATABASE'] names {alias!r}, which is not in DATABASES.",
                id="pgmb.E003",
            )
        ]
    if connections[alias].vendor != "postgresql":
        problems.append(
            Error(
                f"pgmb needs PostgreSQL; database {alias!r} is {connections[alias].vendor}.",
                hint="Use django.db.backends.postgresql with psycopg 3.",
                id="pgmb.E004",
            )
        )
    return problems


@register(Tags.database)
def check_server(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[Error]:
    """Runs only when asked for database checks (``check --database default``, ``migrate``)."""
    alias = conf.get().DATABASE
    if not databases or alias not in databases or connections[alias].vendor != "postgresql":
        return []
    version = connections[alias].cursor().connection.info.server_version
    if version < 140000:
        return [
            Error(
                f"pgmb needs PostgreSQL 14 or later; the server is {version // 10000}.",
                id="pgmb.E005",
            )
        ]
    return []


@register(Tags.database)
def check_in_database_dispatch(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[Warning]:
    """What the in-database dispatch path (pg_cron + http/plpython3u) lacks, and what to do.

    A database check, so it runs in ``manage.py check --database default`` and ``migrate``,
    not before every command. Only warnings: ``manage.py pgmb_dispatch`` works without any
    of it. Silence them with ``SILENCED_SYSTEM_CHECKS`` if you dispatch only from Python.
    """
    alias = _database_alias(databases)
    if alias is None:
        return []
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT to_regprocedure('pgmb.http_transport()') IS NOT NULL")
            if not cursor.fetchone()[0]:
                return []  # not migrated yet: migrate reports that
            caps = indb.capabilities(cursor)
    except Exception as exc:  # a check must report, not crash
        return [Warning(f"pgmb could not inspect database {alias!r}: {exc}", id="pgmb.W000")]
    found: list[Warning] = []
    if not caps.pg_cron_preloaded:
        found.append(
            Warning(
                "pg_cron is not preloaded: the in-database dispatcher cannot be scheduled.",
                hint="Set shared_preload_libraries = 'pg_cron' and cron.database_name = "
                f"'{caps.database}' in postgresql.conf, restart PostgreSQL, then run "
                "'manage.py pgmb_cron install' (or use 'manage.py pgmb_dispatch').",
                id="pgmb.W001",
            )
        )
    elif caps.pg_cron_database != caps.database:
        found.append(
            Warning(
                f"pg_cron serves database {caps.pg_cron_database!r}, not {caps.database!r}.",
                hint=f"Set cron.database_name = '{caps.database}' and restart PostgreSQL.",
                id="pgmb.W002",
            )
        )
    elif caps.pg_cron_version is None:
        found.append(
            Warning(
                "pg_cron is preloaded for this database but not installed in it.",
                hint="Run 'manage.py pgmb_cron install'.",
                id="pgmb.W003",
            )
        )
    if caps.transport is None:
        found.append(
            Warning(
                "No HTTP transport for the in-database dispatcher (neither the http extension "
                "nor plpython3u).",
                hint="Install pgsql-http (CREATE EXTENSION http), or PL/Python (Debian: "
                "postgresql-plpython3-NN) and run 'manage.py pgmb_cron install' as a "
                "superuser; or dispatch with 'manage.py pgmb_dispatch' instead.",
                id="pgmb.W004",
            )
        )
    return found


def _database_alias(databases: Any) -> str | None:
    """The alias of pgmb's database when database checks were asked for it, else None."""
    alias = conf.get().DATABASE
    if (
        not databases
        or alias not in databases
        or alias not in settings.DATABASES
        or connections[alias].vendor != "postgresql"
    ):
        return None
    return alias


@register(Tags.database)
def check_writable_schemas(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[Error | Warning]:
    """Other roles may create in the tables' schema or in pgmb: pgmb's SECURITY DEFINER
    functions refuse to run (a planted operator would run as their owner). A warning, not
    an error: the Django side works without them, and migrate must go on (PostgreSQL 14
    lets PUBLIC create in public by default)."""
    alias = _database_alias(databases)
    if alias is None:
        return []
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT to_regprocedure('pgmb.schema_writers()') IS NOT NULL")
            if not cursor.fetchone()[0]:
                return []  # not migrated yet: migrate reports that
        writers = access.schema_writers(using=alias)
    except Exception as exc:  # a check must report, not crash
        return [Warning(f"pgmb could not inspect database {alias!r}: {exc}", id="pgmb.W000")]
    if not writers:
        return []
    revoke = " ".join(f"REVOKE CREATE ON SCHEMA {schema} FROM {role};" for schema, role in writers)
    return [
        Warning(
            "Roles other than pgmb's owner may create objects in "
            + ", ".join(f"schema {schema} ({role})" for schema, role in writers)
            + ": pgmb's SECURITY DEFINER functions refuse to run (a planted operator "
            "would run as their owner).",
            hint=f"As the schema's owner or a superuser, run: {revoke} "
            "See docs/security.md in pgmb's repository.",
            id="pgmb.W006",
        )
    ]


@register(Tags.database)
def check_http_extension(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[Warning]:
    """The http extension's functions are executable by PUBLIC as it installs them: every
    role could post from the database server, past pgmb's own grants."""
    alias = _database_alias(databases)
    if alias is None:
        return []
    try:
        public = access.public_extension_functions("http", using=alias)
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT current_user")
            owner = cursor.fetchone()[0]
    except Exception as exc:  # a check must report, not crash
        return [Warning(f"pgmb could not inspect database {alias!r}: {exc}", id="pgmb.W000")]
    if not public:
        return []
    functions = ", ".join(public)
    return [
        Warning(
            f"Every role may post from the database server with the http extension: "
            f"{functions} are executable by PUBLIC.",
            hint="As a superuser (or the extension's owner), run: "
            f"REVOKE EXECUTE ON FUNCTION {functions} FROM PUBLIC; "
            f'GRANT EXECUTE ON FUNCTION {functions} TO "{owner}", pgmb_admin;',
            id="pgmb.W005",
        )
    ]


@register(Tags.database)
def check_in_database_endpoint_policy(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[Warning]:
    """The in-database path reads the endpoint policy from the database
    (pgmb.endpoint_policy), written by migrate and ``manage.py pgmb_cron install``: a
    PGMB["ENDPOINT_POLICY"] changed since is not enforced there until it is written again."""
    alias = _database_alias(databases)
    if alias is None:
        return []
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT to_regclass('pgmb.endpoint_policy') IS NOT NULL")
            if not cursor.fetchone()[0]:
                return []  # not migrated yet: migrate reports that
            matches = indb.endpoint_policy_matches(cursor)
    except Exception as exc:  # a check must report, not crash
        return [Warning(f"pgmb could not inspect database {alias!r}: {exc}", id="pgmb.W000")]
    if matches:
        return []
    return [
        Warning(
            "The in-database dispatcher's endpoint policy (pgmb.endpoint_policy) is not "
            "PGMB['ENDPOINT_POLICY'].",
            hint="Run 'manage.py pgmb_cron install' to store the setting in the database.",
            id="pgmb.W040",
        )
    ]
