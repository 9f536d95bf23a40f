"""pgmb as a PostgreSQL extension, for a database without Django (docs/extension.md).

The extension's scripts are written from the release migrations themselves: each
migration's statements as ``manage.py sqlmigrate`` collects them (Django's tables and
triggers, then the migration's frozen SQL files), so ``CREATE EXTENSION pgmb`` builds the
schema ``migrate`` builds, and ``ALTER EXTENSION pgmb UPDATE`` runs what ``migrate`` runs
between two releases. ``pgmb--<version>.sql`` installs the newest release (every migration
in turn), and the first release's installs that one; ``pgmb--<a>--<b>.sql`` updates one
release to the next.

What a migration does in Python is written as SQL for the extension
(:class:`pgmb.sql.operations.LockTables`, :class:`~pgmb.sql.operations.RunPlpythonSQL`):
the PL/Python transport is loaded where ``plpython3u`` is installed in the database
beforehand (an extension script may not create another extension). 0.1.0's migration also
schedules pg_cron's jobs from Python: with the extension, ``SELECT pgmb.cron_install()``
does it.

Tables the script creates are the extension's members: each is marked for pg_dump
(``pg_extension_config_dump``), so their rows are dumped as any table's.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from django.db import connections, transaction
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder

from . import conf

NAME = "pgmb"
APP = "pgmb"
#: A release migration's name: 0001_initial is 0.1.0; the others say their release.
_RELEASE = re.compile(r"\d{4}_release_(\d+)_(\d+)_(\d+)")


@dataclass(frozen=True)
class Release:
    migration: str
    version: str


def releases() -> list[Release]:
    """The release migrations in order, each with its version (one migration a release:
    docs/decisions/0023-one-migration-per-release.md)."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    found = []
    for app, name in loader.graph.forwards_plan((APP, loader.graph.leaf_nodes(APP)[0][1])):
        if app != APP:
            continue
        match = _RELEASE.fullmatch(name)
        if name == "0001_initial":
            found.append(Release(name, "0.1.0"))
        elif match:
            found.append(Release(name, ".".join(match.groups())))
        else:
            raise ValueError(f"migration {name} is not a release's: one migration a release")
    return found


def _statements(release: Release, using: str) -> str:
    """The migration's SQL as sqlmigrate collects it, without a transaction of its own."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    key = (APP, release.migration)
    state = loader.project_state(key, at_end=False)
    with connections[using].schema_editor(collect_sql=True, atomic=False) as editor:
        loader.graph.nodes[key].apply(state, editor, collect_sql=True)
    return "\n".join(editor.collected_sql)


#: After each script: its new tables and sequences marked for pg_dump (their rows are
#: dumped with the database, as any table's; a partition made later is no member).
_MARK_FOR_DUMP = """
-- Tables and sequences of this script are the extension's: pg_dump dumps their rows
-- only when they are marked so.
DO $pgmb_dump$
DECLARE
    member regclass;
BEGIN
    FOR member IN
        SELECT c.oid::regclass FROM pg_catalog.pg_depend d
        JOIN pg_catalog.pg_class c
          ON c.oid = d.objid AND d.classid = 'pg_catalog.pg_class'::regclass
        JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
        WHERE e.extname = 'pgmb' AND d.deptype = 'e' AND c.relkind IN ('r', 'S')
          AND c.oid <> ALL (coalesce(e.extconfig, '{}'))
        ORDER BY c.oid
    LOOP
        PERFORM pg_catalog.pg_extension_config_dump(member, '');
    END LOOP;
END $pgmb_dump$;
"""


def _script(kind: str, body: str) -> str:
    return (
        f"-- pgmb {kind}, written by `python -m pgmb extension` from the release\n"
        "-- migrations (pgmb/extension.py): do not edit.\n"
        '\\echo Use "CREATE EXTENSION pgmb" to load this file. \\quit\n\n'
        f"{body}\n{_MARK_FOR_DUMP}"
    )


def scripts(using: str | None = None) -> dict[str, str]:
    """Every file of the extension, by name: the control file, the install script of the
    newest release and an update script from each release to the next."""
    alias = using or conf.get().DATABASE
    found = releases()
    bodies = {r.version: _statements(r, alias) for r in found}
    newest = found[-1].version
    files = {
        f"{NAME}.control": (
            "# pgmb: PostgreSQL as a message broker (docs/extension.md)\n"
            f"comment = 'pgmb message broker: topic routing, HTTP push, pull queues'\n"
            f"default_version = '{newest}'\n"
            "relocatable = false\n"
            "requires = 'plpgsql'\n"
            "superuser = true\n"
        ),
        # The first release's alone too: an update from it runs the update scripts.
        f"{NAME}--{found[0].version}.sql": _script(found[0].version, bodies[found[0].version]),
        f"{NAME}--{newest}.sql": _script(
            f"{newest}, whole", "\n\n".join(bodies[r.version] for r in found)
        ),
    }
    for old, new in itertools.pairwise(found):
        files[f"{NAME}--{old.version}--{new.version}.sql"] = _script(
            f"{old.version} to {new.version}", bodies[new.version]
        )
    return files


def write(folder: Path, using: str | None = None) -> list[Path]:
    """Write the extension's files into ``folder`` (made if missing); their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in scripts(using).items():
        path = folder / name
        path.write_text(text)
        written.append(path)
    return written


#: The ALTER EXTENSION ... DROP keyword of each kind of member pg_identify_object names.
_MEMBER_KINDS = {
    "schema": "SCHEMA",
    "table": "TABLE",
    "view": "VIEW",
    "sequence": "SEQUENCE",
    "function": "FUNCTION",
    "procedure": "PROCEDURE",
    "type": "TYPE",
    "composite type": "TYPE",
}


class NotAdoptable(Exception):
    """The database cannot be adopted as it is: the message says why and what to do."""


def adopt(using: str | None = None) -> str:
    """Make a database that ``CREATE EXTENSION pgmb`` set up one that Django's migrations
    manage, in one transaction: every object leaves the extension (nothing is dropped or
    changed), the extension's entry goes, and the release migrations up to the extension's
    version are recorded as applied; ``migrate`` then runs the later ones. Returns the
    version adopted."""
    alias = using or conf.get().DATABASE
    connection = connections[alias]
    found = releases()
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = %s", [NAME])
        row = cursor.fetchone()
        if row is None:
            raise NotAdoptable("extension pgmb is not installed in this database: nothing to adopt")
        version = row[0]
        versions = [r.version for r in found]
        if version not in versions:
            raise NotAdoptable(
                f"extension pgmb {version} is not a release this pgmb knows "
                f"({', '.join(versions)}): install the pgmb of that release, "
                "or ALTER EXTENSION pgmb UPDATE to one of these first"
            )
        upto = [r.migration for r in found[: versions.index(version) + 1]]
        recorder = MigrationRecorder(connection)
        if recorder.has_table() and any(app == APP for app, _ in recorder.applied_migrations()):
            raise NotAdoptable("Django's migrations of pgmb are recorded here already")
        cursor.execute(
            "SELECT o.type, o.identity FROM pg_catalog.pg_depend d "
            "JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid "
            "CROSS JOIN LATERAL pg_catalog.pg_identify_object(d.classid, d.objid, d.objsubid) o "
            "WHERE e.extname = %s AND d.deptype = 'e' ORDER BY d.classid, d.objid",
            [NAME],
        )
        members = cursor.fetchall()
        unknown = sorted({kind for kind, _ in members if kind not in _MEMBER_KINDS})
        if unknown:
            raise NotAdoptable(f"extension pgmb has members of kinds pgmb never makes: {unknown}")
        for kind, identity in members:
            cursor.execute(f"ALTER EXTENSION {NAME} DROP {_MEMBER_KINDS[kind]} {identity}")
        cursor.execute(f"DROP EXTENSION {NAME}")
        recorder.ensure_schema()
        for name in upto:
            recorder.record_applied(APP, name)
    return str(version)
