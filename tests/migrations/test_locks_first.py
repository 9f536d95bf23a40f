"""The unreleased migration takes the locks of every table it changes first, in its opening
LockTables step (CONTRIBUTING.md, Migrations; docs/decisions/0062): a table it alters, or
puts a trigger or index on, later without having locked it is a deadlock with a running
dispatcher or producer waiting to happen."""

from __future__ import annotations

import re

from django.db.migrations.loader import MigrationLoader

from pgmb.sql import migration_script
from pgmb.sql.operations import LockTables, RunMigrationSQL
from tests.migrations.releases import UNRELEASED

#: The statements of a migration's SQL that lock a table, and the table they name.
LOCKING = re.compile(
    r"\b(?:ALTER\s+TABLE(?:\s+IF\s+EXISTS)?(?:\s+ONLY)?"
    r"|(?:CREATE|DROP)\s+(?:OR\s+REPLACE\s+)?(?:CONSTRAINT\s+)?TRIGGER\s+(?:IF\s+EXISTS\s+)?\S+"
    r"(?:\s+(?!ON\b)\S+)*?\s+ON"
    r"|CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:IF\s+NOT\s+EXISTS\s+)?\S+\s+ON(?:\s+ONLY)?"
    r"|LOCK\s+TABLE(?:\s+ONLY)?)\s+(?!ONLY\b)([\w.\"]+)",
    re.IGNORECASE,
)


#: A table the migration's SQL makes: no running dispatcher or producer holds it yet.
CREATING = re.compile(r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?([\w.\"]+)", re.IGNORECASE)


def _without_comments(text: str) -> str:
    return re.sub(r"--[^\n]*", "", text)


def _tables_changed(migration) -> set[str]:
    """The tables the migration's SQL files and Django operations change."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    state = loader.project_state(("pgmb", migration.name), at_end=False)
    tables = set()
    for operation in migration.operations:
        if isinstance(operation, RunMigrationSQL):
            text = _without_comments(migration_script(operation.sql_name))
            made = {name.replace('"', "") for name in CREATING.findall(text)}
            tables |= {name.replace('"', "") for name in LOCKING.findall(text)} - made
        elif getattr(operation, "model_name", None):
            model = state.apps.get_model("pgmb", operation.model_name)
            tables.add(model._meta.db_table)
    return tables


def test_the_migration_opens_by_locking_every_table_it_changes():
    loader = MigrationLoader(None, ignore_no_migrations=True)
    migration = loader.disk_migrations[("pgmb", UNRELEASED)]
    first = migration.operations[0]
    assert isinstance(first, LockTables), f"{UNRELEASED} must open with LockTables(...)"
    assert not any(isinstance(op, LockTables) for op in migration.operations[1:])
    unlocked = _tables_changed(migration) - set(first.tables)
    assert unlocked == set(), f"{UNRELEASED} changes tables its LockTables does not name"


def test_the_check_sees_what_locks_a_table():
    text = _without_comments(
        "ALTER TABLE pgmb_message ADD COLUMN producer name;\n"
        "ALTER TABLE IF EXISTS ONLY pgmb.endpoint_policy ALTER COLUMN deny SET DEFAULT '{}';\n"
        "CREATE OR REPLACE TRIGGER t BEFORE INSERT ON pgmb_delivery FOR EACH ROW EXECUTE ...;\n"
        "DROP TRIGGER IF EXISTS t ON pgmb_attempt;\n"
        "CREATE UNIQUE INDEX IF NOT EXISTS i ON pgmb_queue (name);\n"
        "-- ALTER TABLE pgmb_worker, in a comment\n"
    )
    assert set(LOCKING.findall(text)) == {
        "pgmb_message",
        "pgmb.endpoint_policy",
        "pgmb_delivery",
        "pgmb_attempt",
        "pgmb_queue",
    }
