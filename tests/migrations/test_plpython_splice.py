"""The PL/Python transport's code is pgmb/sql/plpython_transport.py, which ruff and mypy
check, and the SQL that loads it runs that text as it is (decision 0069)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from mypy import config_parser
from mypy.find_sources import create_source_list
from mypy.options import Options

from pgmb import indb, sql
from pgmb.sql import plpython_transport
from tests.migrations.conftest import ROOT
from tests.migrations.releases import FROZEN, frozen

MODULE = Path(plpython_transport.__file__)
TEXT = MODULE.read_text(encoding="utf-8")


def _as_plpython_compiles_it(name: str, body: str) -> None:
    """Compile body as PL/Python does: the lines of a function, each indented by a tab."""
    lines = body.strip("\n").split("\n")
    compile(
        f"def __plpython_procedure_{name}():\n" + "".join(f"\t{line}\n" for line in lines),
        name,
        "exec",
    )


def test_the_transport_function_runs_the_module_as_it_is():
    body = indb.plpython_bodies()["load_plpython_transport"]
    assert body.startswith("\n" + TEXT), "load_plpython_transport's body is not the module's text"
    # After the module, only the line that keeps the session's Transport.
    assert body[len(TEXT) + 1 :].strip().splitlines()[-1] == (
        'GD["pgmb_transport_v3"] = Transport(plpy, GD)'
    )


def test_no_splice_mark_is_left_in_what_loads():
    for names in (sql.SCHEMA, sql.PLPYTHON):
        assert not re.search("^-- splice:", sql.schema_source(names), re.MULTILINE)
    raw = sql.script("schema/plpython.sql")
    assert raw.count("-- splice: plpython_transport.py\n") == 1
    assert TEXT not in raw  # the source holds the mark, never a copy of the module


def test_the_unreleased_migration_runs_the_module_as_it_is():
    [filename] = [name for name, names in FROZEN.items() if names == "PLPYTHON"]
    copy = (ROOT / "pgmb" / "sql" / "migrations" / filename).read_text(encoding="utf-8")
    assert copy == frozen(filename), f"pgmb/sql/migrations/{filename} is stale: make schema"
    assert copy.count(TEXT) == 1


def test_every_body_compiles_as_plpython_compiles_it():
    # A module may hold what a function body may not (from __future__ imports, say).
    for name, body in indb.plpython_bodies().items():
        _as_plpython_compiles_it(name, body)


def test_the_module_never_ends_the_body_it_is_spliced_into():
    assert "$py$" not in TEXT


def test_ruff_checks_the_module():
    listed = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--show-files", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(MODULE) in listed.stdout.split(), "ruff does not check the module"


def test_mypy_checks_the_module(monkeypatch):
    monkeypatch.chdir(ROOT)
    options = Options()
    config_parser.parse_config_file(options, lambda: None, "pyproject.toml", None, None)
    checked = {source.module for source in create_source_list(options.files or [], options)}
    assert plpython_transport.__name__ in checked, "mypy does not check the module"
    assert not options.clone_for_module(plpython_transport.__name__).ignore_errors


@pytest.mark.django_db
def test_the_database_runs_the_module_as_it_is(needs_plpython):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT prosrc FROM pg_proc WHERE oid = 'pgmb.load_plpython_transport()'::regprocedure"
        )
        [(source,)] = cursor.fetchall()
        assert TEXT in source
        assert indb.plpython_transport_state(cursor) == "current"
