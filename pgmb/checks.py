"""System checks: misconfiguration is reported by ``manage.py check``, not at run time."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import connections

from . import access, conf, group_roles, indb


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
            plpython = indb.plpython_transport_state(cursor)
    except Exception as exc:  # a check must report, not crash
        return [Warning(f"pgmb could not inspect database {alias!r}: {exc}", id="pgmb.W000")]
    found = pg_cron_warnings(caps)
    if caps.transport is None:
        refused = caps.plpython_installed and not caps.plpython_loadable
        found.append(
            Warning(
                "No HTTP transport for the in-database dispatcher (neither the http extension "
                "nor pgmb's PL/Python transport"
                + (
                    f": plpython3u is here, but role {caps.role!r} may not create functions "
                    "in it, an untrusted language)."
                    if refused
                    else ")."
                ),
                hint=indb.transport_statements(caps),
                id="pgmb.W004",
            )
        )
    if plpython == "outdated":
        found.append(
            Warning(
                "pgmb's PL/Python transport here is another version's than this pgmb's"
                + (
                    "."
                    if caps.plpython_loadable
                    else f": role {caps.role!r} may not replace it (plpython3u is untrusted)."
                ),
                hint="Run 'manage.py pgmb_cron install'."
                if caps.plpython_loadable
                else f"A DBA (a superuser) runs in database {caps.database!r} "
                f"{indb.LOAD_PLPYTHON}.",
                id="pgmb.W007",
            )
        )
    return found


def pg_cron_warnings(caps: indb.Capabilities) -> list[Warning]:
    """What keeps this role from scheduling the in-database dispatcher with pg_cron; read
    from the catalogs, and from the server's settings only where the role may read them."""
    dba = indb.pg_cron_statements(caps)
    if caps.pg_cron_version is None and not caps.pg_cron_available:
        return [
            Warning(
                "pg_cron is not available on this server: the in-database dispatcher cannot "
                "be scheduled.",
                hint="Dispatch with 'manage.py pgmb_dispatch', which needs nothing but this "
                "role; or install pg_cron on the server (docs/in-database.md).",
                id="pgmb.W001",
            )
        ]
    if caps.pg_cron_preloaded is None:
        return [
            Warning(
                f"pg_cron is not installed in database {caps.database!r}, and role "
                f"{caps.role!r} may not read whether it is preloaded for it "
                "(shared_preload_libraries, cron.database_name).",
                hint=dba,
                id="pgmb.W001",
            )
        ]
    if not caps.pg_cron_preloaded:
        return [
            Warning(
                "pg_cron is not preloaded: the in-database dispatcher cannot be scheduled.",
                hint=dba,
                id="pgmb.W001",
            )
        ]
    if caps.pg_cron_database != caps.database:
        return [
            Warning(
                f"pg_cron serves database {caps.pg_cron_database!r}, not {caps.database!r}.",
                hint=dba,
                id="pgmb.W002",
            )
        ]
    if caps.pg_cron_version is None:
        return [
            Warning(
                "pg_cron is preloaded for this database but not installed in it.",
                hint="Run 'manage.py pgmb_cron install'." if caps.superuser else dba,
                id="pgmb.W003",
            )
        ]
    if not caps.pg_cron_usable:
        return [
            Warning(
                f"Role {caps.role!r} may not use pg_cron (schema cron): the in-database "
                "dispatcher cannot be scheduled.",
                hint=dba,
                id="pgmb.W050",
            )
        ]
    return []


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
    functions refuse to run (a planted operator would run as their owner), and with them
    every pgmb function, the owner's ``pgmb.create`` too. A state in which nothing works is
    an error (docs/decisions/0061-a-writable-schema-is-an-error.md): ``check`` fails, and
    ``migrate``'s report says it first. The first ``migrate`` goes on, as pgmb is not in
    the database when its checks run; a later one stops here until the schema is closed."""
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
        Error(
            "Roles other than pgmb's owner may create objects in "
            + ", ".join(f"schema {schema} ({role})" for schema, role in writers)
            + ": every pgmb function refuses to run, the owner's pgmb.create included (a "
            "planted operator would run as the owner of pgmb's SECURITY DEFINER functions).",
            hint=f"As the schema's owner or a superuser, run: {revoke} "
            "See docs/security.md in pgmb's repository.",
            id="pgmb.E006",
        )
    ]


@register(Tags.database)
def check_group_roles(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[Warning]:
    """What keeps other programs' roles from being given pgmb's group roles: roles the
    migrating role could not create (no CREATEROLE), roles made after migrating, roles it
    may not hand out (no ADMIN OPTION: since PostgreSQL 16, CREATEROLE alone is not
    enough). Warnings: the application itself needs none of them."""
    alias = _database_alias(databases)
    if alias is None:
        return []
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT to_regprocedure('pgmb.group_roles()') IS NOT NULL")
            if not cursor.fetchone()[0]:
                return []  # not migrated yet: migrate reports that
            state = group_roles.role_state(cursor)
    except Exception as exc:  # a check must report, not crash
        return [Warning(f"pgmb could not inspect database {alias!r}: {exc}", id="pgmb.W000")]
    found = []
    if missing := state.missing():
        found.append(
            Warning(
                f"The roles {', '.join(missing)} do not exist, and role {state.owner} may not "
                "create them: no other role can be given pgmb's access.",
                hint=state.create_statements(),
                id="pgmb.W051",
            )
        )
    if not_applied := state.not_applied():
        found.append(
            Warning(
                f"The roles {', '.join(not_applied)} were made after pgmb was migrated: they "
                "lack pgmb's grants.",
                hint=f"As {state.owner}, run: SELECT pgmb.install_access();",
                id="pgmb.W052",
            )
        )
    if not_grantable := state.not_grantable():
        found.append(
            Warning(
                f"Role {state.owner} may not grant {', '.join(not_grantable)}: "
                "pgmb.grant_publish_access and pgmb.grant_queue_access are refused.",
                hint=state.admin_option_statement(),
                id="pgmb.W053",
            )
        )
    return found


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
def check_public_routines(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[Warning]:
    """Routines of schema pgmb that every role may execute beyond the reviewed list (made
    after migrating by a superuser, whose defaults give PUBLIC EXECUTE, or granted)."""
    alias = _database_alias(databases)
    if alias is None:
        return []
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT to_regnamespace('pgmb') IS NOT NULL")
            if not cursor.fetchone()[0]:
                return []  # not migrated yet: migrate reports that
        public = access.unreviewed_public_routines(using=alias)
    except Exception as exc:  # a check must report, not crash
        return [Warning(f"pgmb could not inspect database {alias!r}: {exc}", id="pgmb.W000")]
    if not public:
        return []
    routines = ", ".join(public)
    return [
        Warning(
            f"Every role may execute {routines} in schema pgmb: only the reviewed functions "
            "of docs/security.md are meant to be.",
            hint=f"As the functions' owner, run: REVOKE EXECUTE ON ROUTINE {routines} FROM PUBLIC;",
            id="pgmb.W008",
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


def database_warnings(alias: str) -> list[CheckMessage]:
    """The findings of pgmb's database checks on database ``alias`` (pgmb's), but those
    silenced by SILENCED_SYSTEM_CHECKS: what ``migrate`` reports once pgmb is in it."""
    found: list[CheckMessage] = []
    for check in (
        check_server,
        check_in_database_dispatch,
        check_group_roles,
        check_writable_schemas,
        check_http_extension,
        check_public_routines,
        check_in_database_endpoint_policy,
    ):
        found += check(databases=[alias])
    silenced = set(getattr(settings, "SILENCED_SYSTEM_CHECKS", []))
    return [m for m in found if m.id not in silenced]
