"""What a role that is not a superuser learns about pg_cron in the database pg_cron serves
(the test database): from the catalogs alone, that pg_cron is there; that it may not
schedule until a DBA grants it schema cron, with the statement; and with
pg_read_all_settings, the settings themselves."""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest

from pgmb import checks, indb
from pgmb.db.conninfo import conninfo_from_django

NEVER = "0 0 31 2 *"  # 31 February: a job that is scheduled and never runs


@pytest.fixture
def pg_cron(transactional_db) -> Iterator[psycopg.Connection]:
    """pg_cron installed in the test database for this test (a superuser's session)."""
    with psycopg.connect(**conninfo_from_django("default"), autocommit=True) as su:
        if su.execute(
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_cron'"
        ).fetchone() == (0,):
            pytest.skip("this server has no pg_cron")
        there = su.execute("SELECT count(*) FROM pg_extension WHERE extname = 'pg_cron'").fetchone()
        su.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
        yield su
        if there == (0,):
            su.execute("DROP EXTENSION pg_cron")


def _capabilities(conn: psycopg.Connection) -> indb.Capabilities:
    with conn.cursor() as cursor:
        return indb.capabilities(cursor)


def test_a_role_without_settings_is_told_to_ask_for_schema_cron(pg_cron, login_role):
    name, conn = login_role("pgmb_admin")  # may run pgmb's functions, not read settings
    caps = _capabilities(conn)
    assert (caps.settings_readable, caps.pg_cron_preloaded) == (False, True)
    assert caps.pg_cron_database == caps.database
    assert caps.pg_cron_usable is False
    [problem] = checks.pg_cron_warnings(caps)
    assert problem.id == "pgmb.W050"
    grant = re.search(r"GRANT USAGE ON SCHEMA cron TO \S+;", problem.hint).group(0)
    assert grant == f"GRANT USAGE ON SCHEMA cron TO {name};"
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT cron.schedule('pgmb-test-never', %s, 'SELECT 1')", (NEVER,))

    # Migrating as this role goes on (pgmb.0001_initial schedules the jobs where it may).
    with conn.cursor() as cursor:
        assert indb.install_cron_jobs(cursor) is None

    pg_cron.execute(grant)  # what the DBA runs
    assert checks.pg_cron_warnings(_capabilities(conn)) == []
    [(job,)] = conn.execute("SELECT cron.schedule('pgmb-test-never', %s, 'SELECT 1')", (NEVER,))
    conn.execute("SELECT cron.unschedule(%s)", (job,))


def test_a_role_that_may_read_settings_reads_them(pg_cron, login_role):
    _, conn = login_role("pgmb_admin", "pg_read_all_settings")
    caps = _capabilities(conn)
    assert caps.settings_readable is True
    [(preload, database)] = pg_cron.execute(
        "SELECT current_setting('shared_preload_libraries'), current_setting('cron.database_name')"
    )
    assert caps.pg_cron_preloaded == ("pg_cron" in preload)
    assert caps.pg_cron_database == database
