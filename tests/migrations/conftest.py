"""Scratch databases beside the test database, for checks that need a whole schema."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.migrations.releases import RELEASE_COMMITS

ROOT = Path(__file__).resolve().parents[2]


def conninfo(dbname: str) -> dict:
    params = dict(connection.get_connection_params())
    for django_only in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(django_only, None)
    return {**params, "dbname": dbname}


@contextmanager
def scratch_database(name: str) -> Iterator[dict]:
    """A new empty database (dropped afterwards); yields its psycopg connection arguments."""
    admin = conninfo("postgres")
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield conninfo(name)
    finally:
        with psycopg.connect(**admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def scratch() -> Callable:
    return scratch_database


def manage(dbname: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``django-admin ARGS`` with the test settings against another database."""
    return _run(dbname, "django", *args)


def build_from_source(dbname: str) -> None:
    """Build pgmb's schema in ``dbname`` from the models and ``pgmb/sql/schema/``."""
    _run(dbname, "tests.migrations.from_source")


def _run(dbname: str, module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PGMB_DB_NAME": dbname, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{module} {' '.join(args)}: {result.stderr}"
    return result


@pytest.fixture(scope="session", params=list(RELEASE_COMMITS))
def release(request, tmp_path_factory):
    """Each pgmb release as released: its wheel built from its commit
    (tests/migrations/releases.py), installed apart from this checkout (once a session)."""
    from tests.migrations.released_code import build_release

    version = request.param
    return build_release(version, tmp_path_factory.mktemp(f"pgmb-{version}"))
