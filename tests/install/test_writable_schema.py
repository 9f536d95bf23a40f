"""A database where PUBLIC may create in schema public, as PostgreSQL 14's initdb leaves it
(simulated here with the GRANT 14 starts with; the version matrix runs it on 14 itself):
every pgmb function refuses, the owner's too, so ``check`` fails with ``pgmb.E006`` and
``migrate``'s report says it first, with the one statement that fixes it."""

from __future__ import annotations

import psycopg
import pytest

REVOKE = "REVOKE CREATE ON SCHEMA public FROM PUBLIC;"
CREATE_QUEUE = "SELECT pgmb.create('orders', 'orders.#', 5, NULL)"


def _initdb_14_public(owned) -> None:
    """What PostgreSQL 14's initdb leaves: PUBLIC may create in public (15 revoked it)."""
    with owned.as_superuser() as dba:
        dba.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")


def test_nothing_works_so_check_fails_and_migrate_says_it_first(owned_database):
    owned = owned_database()
    _initdb_14_public(owned)

    migrated = owned.manage("migrate", "--noinput")
    report = migrated.stdout[migrated.stdout.index("pgmb: ") :]
    first, error, hint = report.splitlines()[:3]
    assert first.startswith("pgmb: nothing of pgmb works in database 'default'")
    assert error.startswith("  pgmb.E006: Roles other than pgmb's owner may create objects")
    assert "schema public (PUBLIC)" in error
    assert hint == f"\tHINT: As the schema's owner or a superuser, run: {REVOKE} " + (
        "See docs/security.md in pgmb's repository."
    )

    checked = owned.manage("check", "--database", "default", ok=False)
    assert checked.returncode == 1
    assert "pgmb.E006" in checked.stderr
    with owned.connect() as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(CREATE_QUEUE)
    # A later migrate stops at the error, as at any system check's, unless told not to
    # check (docs/decisions/0061-a-writable-schema-is-an-error.md).
    again = owned.manage("migrate", "--noinput", ok=False)
    assert again.returncode == 1 and "pgmb.E006" in again.stderr
    owned.manage("migrate", "--noinput", "--skip-checks")

    # The one-line fix, by the schema's owner (pg_database_owner on 15: the owner itself).
    with owned.connect() as conn:
        conn.execute(REVOKE)
        conn.execute(CREATE_QUEUE)
    checked = owned.manage("check", "--database", "default")
    assert "pgmb.E006" not in checked.stdout + checked.stderr
