"""``manage.py`` commands as real processes against the test database (dispatchers,
consumers, task workers): started with the test settings, killed if still running when
the test ends."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

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
