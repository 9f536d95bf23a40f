"""pgmb's releases as the migration tests see them (docs/decisions/0023)."""

from __future__ import annotations

from pathlib import Path

from pgmb import sql

#: The last migration of each release, oldest first. The upgrade test starts from each of
#: them; a release's migration is added here when the release is cut, and frozen from then on.
RELEASED: list[str] = ["0001_initial", "0002_release_0_1_1"]

#: The commit each release was cut from, found by its hash (tags may not travel with a
#: clone): tests/migrations/released_code.py builds the release's wheel from it, and the
#: live upgrade test runs that release's code while this checkout migrates. Cutting a
#: release: add its commit here.
RELEASE_COMMITS: dict[str, str] = {"0.1.0": "4ade33d", "0.1.1": "6a53c20"}

#: Every file of each released migration with its SHA-256, as `sha256sum` writes them (cut a
#: release: `sha256sum pgmb/migrations/NNNN_name.py pgmb/sql/migrations/NNNN_name* >>` it).
#: A released migration is never edited: tests/migrations/test_schema.py holds each file to
#: its digest, as `sha256sum -c tests/migrations/released.sha256` does.
RELEASED_DIGESTS = Path(__file__).with_name("released.sha256")


def released_files() -> dict[str, str]:
    """The files of the released migrations and their SHA-256 digests."""
    lines = RELEASED_DIGESTS.read_text().splitlines()
    return {path: digest for digest, path in (line.split(maxsplit=1) for line in lines if line)}


#: The migration of the release in the making. Its frozen SQL copies of pgmb/sql/schema/
#: (FROZEN) are refreshed by `make schema`; a test keeps them equal to the source.
UNRELEASED = "0003_release_0_2_0"

#: Its frozen copies: the file, and the name of the list in pgmb.sql of the source files it
#: copies, in order. After the first release only the PL/Python transport is copied whole
#: (its file replaces every function it defines); the rest of a later release's migration
#: is written by hand, holding only what changed (CONTRIBUTING.md, Migrations).
FROZEN = {
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
