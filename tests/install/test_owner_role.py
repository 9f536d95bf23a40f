"""Migrating as a database's owner that is not a superuser, as managed services give
(docs/operations.md, Managed PostgreSQL): no pg_read_all_settings, CREATEROLE or not, the
group roles made by a DBA beforehand or not. Migrating succeeds; what needs a DBA is
reported by migrate and by check, each with the statements the DBA runs, and those
statements are what makes it work."""

from __future__ import annotations

import re

import psycopg
import pytest

SEND = "SELECT pgmb.send(gen_random_uuid(), 'orders.created', '{\"n\": 1}')"


def _said(result) -> str:
    return result.stdout + result.stderr


def _hint(text: str, check_id: str) -> str:
    """The HINT line that follows warning ``check_id`` in manage.py's output."""
    found = re.search(rf"\({check_id}\).*\n\tHINT: (.*)|{check_id}: .*\n\tHINT: (.*)", text)
    assert found, f"no {check_id} in:\n{text}"
    return found.group(1) or found.group(2)


def _dba_sql(hint: str) -> str:
    """The statements of a hint "A DBA ... runs: SQL Then, as ...", to run as a DBA."""
    return re.search(r"runs: (.*?;)(?: Then,| \(docs)", hint).group(1)


def _server_version(owned) -> int:
    with owned.as_superuser() as conn:
        return conn.info.server_version


def _offers_pg_cron(owned) -> bool:
    """Whether the server has pg_cron (the Debian cluster does; the PostgreSQL 18 of the
    matrix does not)."""
    with owned.as_superuser() as conn:
        query = "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_cron'"
        return conn.execute(query).fetchone() == (1,)


@pytest.mark.parametrize("createrole", [False, True], ids=["nocreaterole", "createrole"])
def test_owner_migrates_and_is_told_what_a_dba_runs(group_roles, owned_database, createrole):
    owned = owned_database(createrole=createrole)
    migrated = owned.manage("migrate", "--noinput")
    assert "Applying pgmb.0001_initial... OK" in migrated.stdout
    said = _said(migrated)
    assert "pg_read_all_settings to examine" not in said

    # What the in-database dispatcher lacks, reported by migrate itself.
    assert "pgmb: database 'default' lacks what follows" in migrated.stdout
    cron_hint = _hint(migrated.stdout, "pgmb.W001")
    if _offers_pg_cron(owned):
        assert f"cron.database_name = '{owned.name}'" in cron_hint
        grant = f"CREATE EXTENSION pg_cron; GRANT USAGE ON SCHEMA cron TO {owned.owner};"
        assert grant in cron_hint
    else:
        assert "pg_cron is not available on this server" in migrated.stdout
    assert "pgmb_dispatch" in cron_hint
    assert "pgmb_dispatch" in _hint(migrated.stdout, "pgmb.W004")

    # The roles: what the owner could do itself, and what a DBA must.
    may_create = createrole
    may_grant = (not group_roles and createrole) or (
        group_roles and createrole and _server_version(owned) < 160000
    )
    assert ("pgmb.W051" in migrated.stdout) == (not group_roles and not may_create)
    assert ("pgmb.W053" in migrated.stdout) == (group_roles and not may_grant)

    # check says the same, and can read everything it needs.
    checked = _said(owned.manage("check", "--database", "default"))
    assert "pgmb.W000" not in checked
    for check_id in ("pgmb.W001", "pgmb.W004", "pgmb.W051", "pgmb.W053"):
        assert (check_id in checked) == (check_id in migrated.stdout), check_id

    # A second migrate has nothing of pgmb's to apply: its report is not repeated.
    assert "lacks what follows" not in owned.manage("migrate", "--noinput").stdout

    publisher = owned.login_role()
    with owned.connect() as conn:
        if not group_roles and not may_create:
            with pytest.raises(psycopg.errors.UndefinedObject, match="pgmb_producer"):
                conn.execute("SELECT pgmb.grant_publish_access(%s)", (publisher,))
            with owned.as_superuser() as dba:
                dba.execute(_dba_sql(_hint(checked, "pgmb.W051")))
            # The roles are there now, without pgmb's grants until the owner applies them.
            made = _said(owned.manage("check", "--database", "default"))
            assert "pgmb.W051" not in made
            assert f"As {owned.owner}, run: SELECT pgmb.install_access();" in made
            assert "pgmb.W052" in made
            assert conn.execute("SELECT pgmb.install_access()").fetchone() == ([],)
        elif not may_grant:
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
                conn.execute("SELECT pgmb.grant_publish_access(%s)", (publisher,))
            assert f"role {owned.owner} may not grant or revoke pgmb_producer" in str(refused.value)
            statement = f"GRANT pgmb_producer TO {owned.owner} WITH ADMIN OPTION;"
            assert statement in refused.value.diag.message_hint
            with owned.as_superuser() as dba:
                dba.execute(_dba_sql(_hint(checked, "pgmb.W053")))
        conn.execute("SELECT pgmb.grant_publish_access(%s)", (publisher,))
    after = _said(owned.manage("check", "--database", "default"))
    assert not re.search(r"pgmb\.W05[123]", after), after

    # The publisher publishes through the role it was given.
    with owned.connect(publisher) as conn:
        conn.execute(SEND)
    with owned.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pgmb_message").fetchone() == (1,)


def test_pgmb_cron_says_what_a_dba_runs(owned_database):
    owned = owned_database()
    owned.manage("migrate", "--noinput")
    status = owned.manage("pgmb_cron", "status").stdout
    install = owned.manage("pgmb_cron", "install", ok=False)
    assert install.returncode == 1
    assert "pg_read_all_settings to examine" not in install.stderr
    assert "pgmb_dispatch" in install.stderr
    if _offers_pg_cron(owned):
        assert f"pg_cron preloaded: unknown (role {owned.owner} may not read it" in status
        assert "to do: A DBA preloads pg_cron" in status
        # pg_cron's own CREATE EXTENSION refused the role: the error says what a DBA runs.
        assert "permission denied to create extension" in install.stderr
        assert "CREATE EXTENSION pg_cron;" in install.stderr
    else:
        assert "pg_cron available on the server: no" in status
        assert "pg_cron is not available on this server" in install.stderr
