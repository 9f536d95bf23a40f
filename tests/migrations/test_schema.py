"""The models plus pgmb/sql/schema/ and the migrations tell the same story."""

from __future__ import annotations

import difflib
import hashlib
import re
from collections import Counter
from importlib import resources
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from pgmb.sql import PLPYTHON, SCHEMA
from pgmb.sql.operations import RunMigrationSQL, RunPlpythonSQL
from tests.migrations.conftest import ROOT, build_from_source
from tests.migrations.releases import FROZEN, RELEASED, UNRELEASED, frozen, released_files

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


def test_every_object_of_the_source_says_what_it_is_for():
    created = re.compile(r"^CREATE (OR REPLACE )?(FUNCTION|PROCEDURE|VIEW|TYPE|TABLE)\b")
    bare = []
    for name in (*SCHEMA, *PLPYTHON):
        lines = SQL_DIR.joinpath(f"schema/{name}.sql").read_text().splitlines()
        for i, line in enumerate(lines):
            if created.match(line) and not (i and lines[i - 1].startswith("--")):
                bare.append(f"schema/{name}.sql:{i + 1}: {line}")
    assert bare == [], "objects without a comment above them:\n" + "\n".join(bare)


@pytest.mark.django_db
def test_the_migrations_build_what_the_models_and_the_source_describe(scratch):
    with connection.cursor() as cursor:
        migrated = _fingerprint(cursor)
    with scratch("pgmb_source_check") as info:
        build_from_source(info["dbname"])
        with psycopg.connect(**info, autocommit=True) as conn, conn.cursor() as cursor:
            from_source = _fingerprint(cursor)
    diff = "\n".join(
        difflib.unified_diff(from_source, migrated, "source", "migrations", lineterm="", n=0)
    )
    # After a release, a change to the source fails here until the next release's migration
    # makes the same change: models plus source against all migrations, whatever their number.
    assert not diff, f"the models plus pgmb/sql/schema/ and the migrations differ:\n{diff[:4000]}"
    assert len(migrated) > 100  # the comparison saw the schema, not two empty lists


@pytest.mark.skipif(UNRELEASED in RELEASED, reason="the release is cut: its copies are frozen")
def test_the_unreleased_migration_runs_the_source_as_it_is():
    for filename in FROZEN:
        copy = SQL_DIR.joinpath(f"migrations/{filename}").read_text(encoding="utf-8")
        assert copy == frozen(filename), f"pgmb/sql/migrations/{filename} is stale: make schema"


def test_a_migration_per_release():
    loader = MigrationLoader(None, ignore_no_migrations=True)
    names = sorted(name for app, name in loader.disk_migrations if app == "pgmb")
    assert names == sorted({*RELEASED, UNRELEASED}), "one migration per release (decision 0023)"


def test_a_released_migration_is_never_edited():
    shipped = [
        path.relative_to(ROOT).as_posix()
        for folder in ("pgmb/migrations", "pgmb/sql/migrations")
        for path in sorted((ROOT / folder).iterdir())
        if path.name.startswith(tuple(f"{name}." for name in RELEASED))
        or path.name.startswith(tuple(f"{name}_" for name in RELEASED))
    ]
    pinned = released_files()
    assert sorted(pinned) == sorted(shipped), "every file of a release is pinned"
    for path, digest in pinned.items():
        found = hashlib.sha256((ROOT / path).read_bytes()).hexdigest()
        assert found == digest, (
            f"{path} belongs to a release and was edited: put the change in the next "
            "release's migration (CONTRIBUTING.md, Migrations)"
        )
