"""pgmb/sql/schema.sql and the versioned migration files tell the same story."""

from __future__ import annotations

import difflib
from collections import Counter
from importlib import resources
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from pgmb.sql.operations import RunMigrationSQL, RunPlpythonSQL

FINGERPRINT = (Path(__file__).parent / "fingerprint.sql").read_text()
SQL_DIR = resources.files("pgmb.sql")


def _fingerprint(cursor) -> list[str]:
    cursor.execute(FINGERPRINT)
    return [" | ".join(str(v) for v in row) for row in cursor.fetchall()]


def test_every_migration_sql_file_is_run_by_exactly_one_migration():
    loader = MigrationLoader(None, ignore_no_migrations=True)
    used = Counter(
        op.sql_name
        for (app, _), migration in loader.disk_migrations.items()
        if app == "pgmb"
        for op in migration.operations
        if isinstance(op, (RunMigrationSQL, RunPlpythonSQL))
    )
    files = {
        p.name.removesuffix(".sql")
        for p in SQL_DIR.joinpath("migrations").iterdir()
        if p.name.endswith(".sql") and not p.name.endswith(".down.sql")
    }
    assert set(used) == files, "a migration SQL file that no migration runs, or the reverse"
    assert [name for name, n in used.items() if n > 1] == []
    downs = {p.name for p in SQL_DIR.joinpath("migrations").iterdir() if ".down." in p.name}
    orphans = {d for d in downs if d.replace(".down.sql", "") not in files}
    assert orphans == set()


def test_each_migration_file_is_numbered_like_its_migration():
    loader = MigrationLoader(None, ignore_no_migrations=True)
    for (app, name), migration in loader.disk_migrations.items():
        if app != "pgmb":
            continue
        for op in migration.operations:
            if isinstance(op, (RunMigrationSQL, RunPlpythonSQL)):
                assert op.sql_name[:4] == name[:4], f"{name} runs {op.sql_name}.sql"


@pytest.mark.django_db
def test_schema_file_builds_the_schema_the_migrations_build(scratch):
    with connection.cursor() as cursor:
        migrated = _fingerprint(cursor)
    with scratch("pgmb_schema_check") as info, psycopg.connect(**info, autocommit=True) as conn:
        conn.execute(SQL_DIR.joinpath("schema.sql").read_text())
        # Server settings the dump sets for its session must not leak into the comparison.
        conn.execute("RESET ALL")
        with conn.cursor() as cursor:
            from_file = _fingerprint(cursor)
    diff = "\n".join(
        difflib.unified_diff(from_file, migrated, "schema.sql", "migrations", lineterm="", n=0)
    )
    assert not diff, f"pgmb/sql/schema.sql is out of date; run 'make schema':\n{diff[:4000]}"
    assert len(migrated) > 100  # the comparison saw the schema, not two empty lists
