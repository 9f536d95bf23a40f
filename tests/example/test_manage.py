"""``python example_project/manage.py`` the way a user runs it: from another folder, with
pgmb not installed, against a fresh database named by the libpq variables."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

import psycopg
import pytest
from django.db import connection

MANAGE = Path(__file__).resolve().parents[2] / "example_project" / "manage.py"


@pytest.fixture
def libpq_env() -> dict[str, str]:
    """PG* variables naming the test cluster (the same server as Django's test database)."""
    db = connection.settings_dict
    return {
        "PGHOST": db["HOST"],
        "PGPORT": str(db["PORT"]),
        "PGUSER": db["USER"],
        "PGPASSWORD": db["PASSWORD"],
    }


def connect(libpq_env: dict[str, str], dbname: str, **kwargs) -> psycopg.Connection:
    params = {key[2:].lower(): value for key, value in libpq_env.items()}  # PGHOST -> host
    return psycopg.connect(dbname=dbname, **params, **kwargs)


@pytest.fixture
def database(libpq_env) -> str:
    name = f"pgmb_example_{uuid.uuid4().hex[:8]}"
    with connect(libpq_env, "postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield name
    with connect(libpq_env, "postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def manage(*args: str, env: dict[str, str], cwd: Path) -> str:
    # -S skips site, and with it the editable install's path hook: only the libraries'
    # folder is on PYTHONPATH, so pgmb is importable only if manage.py finds the checkout.
    environ = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    environ.update(env, PYTHONPATH=sysconfig.get_paths()["purelib"])
    done = subprocess.run(
        [sys.executable, "-S", str(MANAGE), *args],
        env=environ,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_pgmb_is_not_importable_without_manage_py(tmp_path):
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import pgmb"],
        env={**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert "No module named 'pgmb'" in done.stderr  # so the next test proves something


def test_migrate_and_demo_setup_from_another_folder(database, libpq_env, tmp_path):
    env = {**libpq_env, "PGDATABASE": database}

    manage("migrate", "--noinput", env=env, cwd=tmp_path)
    first = manage("demo_setup", "--port", "8765", env=env, cwd=tmp_path)
    again = manage("demo_setup", "--port", "8765", env=env, cwd=tmp_path)
    checked = manage("check", "--database", "default", env=env, cwd=tmp_path)

    assert "worker demo_worker: created [http://127.0.0.1:8765/worker/orders/]" in first
    assert "worker demo_worker: unchanged" in again
    # Warnings may name this throwaway database (pg_cron serves another one); errors may not.
    assert "System check identified" in checked
    assert "ERRORS:" not in checked
    with connect(libpq_env, database) as conn:
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM pgmb_worker), (SELECT count(*) FROM pgmb_queue), "
            "(SELECT count(*) FROM shop_order), "
            "(SELECT count(*) FROM pgmb.messages WHERE NOT routed)"
        ).fetchone()
    assert counts == (2, 3, 6, 2)
