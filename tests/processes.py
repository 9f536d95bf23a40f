"""``manage.py`` commands as real processes against the test database (dispatchers,
consumers, task workers): started with the test settings, killed if still running when
the test ends."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from psycopg import sql

from pgmb.db.conninfo import conninfo_from_django

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def manage_process(transactional_db) -> Iterator[Callable[..., subprocess.Popen]]:
    """``start(*args, env=None)`` runs ``python -m django *args``; ``env`` adds variables."""
    procs: list[subprocess.Popen] = []
    base = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PGMB_DB_NAME": connection.settings_dict["NAME"],
    }

    def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", *args],
            cwd=ROOT,
            env={**base, **(env or {})},
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
        proc.wait(timeout=30)


@contextmanager
def closed_to_connections() -> Iterator[None]:
    """The test database refuses new connections (the open ones stay), then accepts them."""
    name = sql.Identifier(connection.settings_dict["NAME"])
    # A database cannot close itself: this runs from the server's maintenance database.
    other = {**conninfo_from_django("default"), "dbname": "postgres"}
    with psycopg.connect(**other, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(name))
    try:
        yield
    finally:
        with psycopg.connect(**other, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(name))


class StderrLines:
    """The lines a process writes to stderr, collected as they come (a test waits on them
    while the process runs)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        threading.Thread(target=self._read, args=(proc.stderr,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)
