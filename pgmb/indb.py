"""The in-database dispatch path: which parts this database has, and installing them.

Used by the migrations, ``manage.py pgmb_cron`` and the system checks. Each step is
optional: without plpython3u or pg_cron, migrations still succeed, and
``manage.py check --database default`` (and ``migrate``)
says what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError

from . import conf, sql


@dataclass(frozen=True)
class Capabilities:
    """What the in-database path can use in one database, read without privileges: a role
    that may not read the server's settings (a managed service's owner role) gets None
    where they alone would tell."""

    pg_cron_preloaded: bool | None  # None: not installed here, and the settings unreadable
    pg_cron_database: str | None  # cron.database_name: the one database pg_cron serves
    pg_cron_version: str | None  # installed here (CREATE EXTENSION pg_cron), else None
    pg_cron_available: bool  # the server has pg_cron's files (pg_available_extensions)
    pg_cron_usable: bool | None  # the role may use schema cron (None: pg_cron not here)
    http_extension: bool
    http_available: bool  # the server has pgsql-http's files
    plpython_available: bool  # the language can be created (its files are installed)
    plpython_installed: bool
    transport: str | None  # what pgmb.post() uses: 'http', 'plpython3u' or None
    database: str
    role: str  # the role asking: the one a DBA grants to
    role_ident: str  # the same, as an SQL identifier (quoted where it must be)
    superuser: bool
    settings_readable: bool  # superuser or pg_read_all_settings


def capabilities(cursor: Any) -> Capabilities:
    cursor.execute(sql.query("indb.sql", "capabilities"))
    names = [column.name for column in cursor.description]
    return Capabilities(**dict(zip(names, cursor.fetchone(), strict=True)))


def pg_cron_statements(caps: Capabilities) -> str:
    """What a DBA does so that this role may schedule pgmb's jobs with pg_cron here, and
    what the role runs then."""
    steps = []
    if caps.pg_cron_version is None:
        if caps.pg_cron_preloaded is not True or caps.pg_cron_database != caps.database:
            steps.append(
                "preloads pg_cron (shared_preload_libraries) with cron.database_name = "
                f"'{caps.database}' and restarts PostgreSQL (docs/operations.md names each "
                "managed service's settings), then"
            )
        steps.append(f"runs in database {caps.database!r}: CREATE EXTENSION pg_cron;")
    if not caps.pg_cron_usable and not caps.superuser:
        steps.append(f"GRANT USAGE ON SCHEMA cron TO {caps.role_ident};")
    return (
        "A DBA "
        + " ".join(steps)
        + " Then run 'manage.py pgmb_cron install'; or dispatch with 'manage.py "
        "pgmb_dispatch', which needs nothing but this role."
    )


def transport_statements(caps: Capabilities) -> str:
    """What a DBA runs so that the in-database loop has an HTTP transport here."""
    offers = [
        statement
        for statement, available in (
            ("CREATE EXTENSION plpython3u; (PL/Python)", caps.plpython_available),
            ("CREATE EXTENSION http; (pgsql-http)", caps.http_available),
        )
        if available
    ]
    if not offers:
        return (
            "This server offers neither PL/Python (plpython3u; Debian: "
            "postgresql-plpython3-NN) nor pgsql-http (http): dispatch with "
            "'manage.py pgmb_dispatch', which needs nothing but this role."
        )
    return (
        f"A DBA (a superuser) runs in database {caps.database!r}: {' or '.join(offers)} "
        "then 'manage.py pgmb_cron install'; or dispatch with 'manage.py pgmb_dispatch', "
        "which needs nothing but this role."
    )


def install_plpython_transport(cursor: Any, script: str | None = None) -> bool:
    """Create plpython3u if it is available and allowed, then run the transport's SQL.

    ``script`` is the migration's frozen copy when a migration installs it; by default it is
    the current source (``pgmb/sql/schema/plpython.sql``), which ``pgmb_cron install`` runs
    where plpython3u was missing when the database was migrated.
    """
    caps = capabilities(cursor)
    if not caps.plpython_installed and caps.plpython_available:
        cursor.execute("SAVEPOINT pgmb_plpython")
        try:
            cursor.execute(sql.query("indb.sql", "create_plpython"))
        except DatabaseError:  # not a superuser: the system check explains what to do
            cursor.execute("ROLLBACK TO SAVEPOINT pgmb_plpython")
        else:
            cursor.execute("RELEASE SAVEPOINT pgmb_plpython")
    if capabilities(cursor).plpython_installed:
        cursor.execute(sql.schema_source(sql.PLPYTHON) if script is None else script)
        return True
    return False


def endpoint_policy_setting() -> tuple[list[str], list[str]]:
    """PGMB["ENDPOINT_POLICY"] as the (allow, deny) lists pgmb.endpoint_policy holds."""
    policy = conf.get().ENDPOINT_POLICY
    return list(policy.get("allow", [])), list(policy.get("deny", []))


def endpoint_policy_matches(cursor: Any) -> bool:
    """Whether the database's endpoint policy is the setting's (networks compared as
    PostgreSQL writes them: 10.0.0.0/8, not 10/8)."""
    allow, deny = endpoint_policy_setting()
    cursor.execute(
        "SELECT p.allow = %s::cidr[] AND p.deny = %s::cidr[] FROM pgmb.endpoint_policy AS p",
        (allow, deny),
    )
    row = cursor.fetchone()
    return row is not None and bool(row[0])


def write_endpoint_policy(cursor: Any) -> None:
    """Store PGMB["ENDPOINT_POLICY"] where the in-database path reads it
    (pgmb.endpoint_policy): the PL/Python transport checks each address it connects to
    against it, and pgsql-http is used only under the default policy."""
    allow, deny = endpoint_policy_setting()
    cursor.execute(
        "INSERT INTO pgmb.endpoint_policy (one, allow, deny) VALUES (true, %s::cidr[], %s::cidr[]) "
        "ON CONFLICT (one) DO UPDATE SET allow = excluded.allow, deny = excluded.deny",
        (allow, deny),
    )


def install_cron_jobs(cursor: Any) -> str | None:
    """Store the endpoint policy, then schedule pgmb's jobs if pg_cron is installed in this
    database and this role may use it (a managed service's owner role needs USAGE on schema
    cron from a DBA: the check says so, and migrating goes on); say what was done."""
    write_endpoint_policy(cursor)
    caps = capabilities(cursor)
    if caps.pg_cron_version is None or not caps.pg_cron_usable:
        return None
    cursor.execute("SELECT pgmb.cron_install()")
    return cursor.fetchone()[0]
