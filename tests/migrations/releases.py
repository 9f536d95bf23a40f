"""pgmb's releases as the migration tests see them (docs/decisions/0023)."""

from __future__ import annotations

from pgmb import sql

#: The last migration of each release, oldest first. The upgrade test starts from each of
#: them; a release's migration is added here when the release is cut, and frozen from then on.
RELEASED: list[str] = []

#: The migration of the release in the making. Its SQL files are frozen copies of
#: pgmb/sql/schema/ that `make schema` refreshes; a test keeps them equal to the source.
UNRELEASED = "0001_initial"

#: Its frozen copies: the file, and the name of the list in pgmb.sql of the source files it
#: copies, in order.
FROZEN = {
    f"{UNRELEASED}.sql": "SCHEMA",
    f"{UNRELEASED}_plpython.sql": "PLPYTHON",
}


def frozen(filename: str) -> str:
    """What ``pgmb/sql/migrations/<filename>`` holds: a header, then the source files."""
    names = getattr(sql, FROZEN[filename])
    return (
        f"-- What migration {UNRELEASED} runs: a frozen copy of the files of pgmb/sql/schema/\n"
        f"-- that pgmb.sql.{FROZEN[filename]} names, in its order.\n"
        "-- Written by `make schema` until its release is cut, never edited after: read and\n"
        "-- change pgmb/sql/schema/, and put a released schema's changes in the next\n"
        "-- release's migration (docs/decisions/0023-one-migration-per-release.md).\n\n"
        + sql.schema_source(names)
    )
