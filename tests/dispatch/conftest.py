"""Running dispatchers for tests: in this process (asyncio) or as real subprocesses."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection, connections

from pgmb.dispatch.database import conninfo_from_django
from pgmb.dispatch.engine import Dispatcher, Options, Stats

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def dispatch(transactional_db) -> Callable[..., Stats]:
    """Run a dispatcher in this process until idle (or ``max_seconds``); return its stats."""

    def run(**options) -> Stats:
        options.setdefault("until_idle", True)
        options.setdefault("max_seconds", 120)  # only a guard against a hang
        options.setdefault("poll_interval", 0.05)
        return asyncio.run(Dispatcher(conninfo_from_django("default"), Options(**options)).run())

    return run


@pytest.fixture
def spawn(transactional_db) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start ``manage.py pgmb_dispatch`` as a real process against the test database."""
    procs: list[subprocess.Popen] = []
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PGMB_DB_NAME": connection.settings_dict["NAME"],
        # The second database's test name, for a test that asked for it (test_databases).
        "PGMB_SECOND_DB_NAME": connections["second"].settings_dict["NAME"],
    }

    def start(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "pgmb_dispatch", *args],
            cwd=ROOT,
            env={**env, **(extra_env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
