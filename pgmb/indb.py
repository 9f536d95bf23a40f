"""The in-database dispatch path: which parts this database has, and installing them.

Used by the migrations, ``manage.py pgmb_cron`` and the system checks. Each step is
optional: without plpython3u or pg_cron, or where this role may not load the PL/Python
transport (only a superuser creates functions in an untrusted language), migrations still
succeed, and ``manage.py check --database default`` (and ``migrate``) says what is missing
and what a DBA runs (docs/decisions/0060-an-owner-that-is-not-a-superuser.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from django.db import DatabaseError

from . import conf, sql

#: Deliveries the in-database loop claims at a time when no batch is given: the default of
#: ``manage.py pgmb_cron install --batch``, and in SQL ``pgmb.indb_batch()``, the default of
#: pgmb.dispatch_loop and pgmb.cron_install (tests/rules/test_loop_constants.py).
DEFAULT_BATCH = 50


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
    plpython_loadable: bool  # this role may load the PL/Python transport (a superuser)
    pgmb_owner: str | None  # the owner of schema pgmb (None before it is made)
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
    plpython = "CREATE EXTENSION IF NOT EXISTS plpython3u;"
    if not caps.plpython_loadable:
        plpython += f" then, as that superuser, {LOAD_PLPYTHON}"
    offers = [
        statement
        for statement, available in (
            (f"{plpython} (PL/Python)", caps.plpython_available),
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
        f"A DBA (a superuser) runs in database {caps.database!r}: {' or '.join(offers)}. "
        f"Then, as {caps.role}, run 'manage.py pgmb_cron install'; or dispatch with "
        "'manage.py pgmb_dispatch', which needs nothing but this role."
    )


#: What a superuser runs where the role migrating may not load the PL/Python transport.
LOAD_PLPYTHON = (
    "'manage.py pgmb_cron install' connecting as itself (only a superuser creates "
    "functions in an untrusted language: run by a superuser other than pgmb's owner, it "
    "loads pgmb's PL/Python transport and schedules no job)"
)


TransportState = Literal["absent", "current", "outdated"]


def plpython_transport_state(cursor: Any) -> TransportState:
    """Whether pgmb's PL/Python functions here are this version's (their bodies compared
    with ``pgmb/sql/schema/plpython.sql``): a role that may not replace them leaves an
    older version's in place when it migrates."""
    cursor.execute(sql.query("indb.sql", "plpython_functions"))
    here = dict(cursor.fetchall())
    if not here:
        return "absent"
    return "current" if here == plpython_bodies() else "outdated"


def plpython_bodies() -> dict[str, str]:
    """{function name: body} of the functions ``pgmb/sql/schema/plpython.sql`` defines, with
    ``pgmb/sql/plpython_transport.py`` spliced in (:func:`pgmb.sql.schema_source`)."""
    return dict(_PLPYTHON_FUNCTION.findall(sql.schema_source(sql.PLPYTHON)))


_PLPYTHON_FUNCTION = re.compile(
    r"^CREATE OR REPLACE FUNCTION pgmb\.(\w+)\(.*?\$py\$(.*?)\$py\$", re.DOTALL | re.MULTILINE
)


def install_plpython_transport(cursor: Any, script: str | None = None) -> bool:
    """Create plpython3u if it is available, then run the transport's SQL, where this role
    may (a superuser); say whether the transport was loaded.

    Elsewhere (a managed service's owner role) this does nothing: the system checks say
    what a superuser runs, and ``manage.py pgmb_cron install`` run by one loads it then.
    ``script`` is the migration's frozen copy when a migration installs it; by default it is
    the current source (``pgmb/sql/schema/plpython.sql``).
    """
    caps = capabilities(cursor)
    if not caps.plpython_loadable:
        return False
    if not caps.plpython_installed and caps.plpython_available:
        cursor.execute("SAVEPOINT pgmb_plpython")
        try:
            cursor.execute(sql.query("indb.sql", "create_plpython"))
        except DatabaseError:  # refused all the same: the system check explains what to do
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
