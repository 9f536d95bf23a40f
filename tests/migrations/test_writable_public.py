"""Migrating where PUBLIC may create in schema public (PostgreSQL 14 as installed): the
migration goes on and its report says what to revoke (`check` fails on it:
tests/install/test_writable_schema.py); SQL callers are refused until it is revoked."""

from __future__ import annotations

import psycopg
import pytest

from .conftest import manage


@pytest.mark.django_db
def test_migrate_goes_on_and_reports_where_public_is_writable(scratch):
    with scratch("pgmb_writable_public") as info:
        with psycopg.connect(**info, autocommit=True) as conn:
            conn.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        migrated = manage(info["dbname"], "migrate", "--noinput")
        assert "Applying pgmb.0001_initial... OK" in migrated.stdout
        said = migrated.stdout
        assert "pgmb.E006" in said
        assert "REVOKE CREATE ON SCHEMA public FROM PUBLIC;" in said
        with psycopg.connect(**info, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="pgmb refuses"):
                conn.execute("SELECT pgmb.install_access()")
            send = "SELECT pgmb.send(pgmb.uuid_v7(), 'a.b', '{}')"
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="pgmb refuses"):
                conn.execute(send)
            conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
            conn.execute(send)
            assert conn.execute("SELECT pgmb.install_access()").fetchone() is not None
