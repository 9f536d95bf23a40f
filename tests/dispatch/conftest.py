"""Running dispatchers for tests: in this process (asyncio) or as real subprocesses."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable

import pytest
from django.db import connections

from pgmb.db.conninfo import conninfo_from_django
from pgmb.dispatch.engine import Dispatcher, Options, Stats
from tests.roles import login_role, owner  # noqa: F401 (fixtures)


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
def spawn(manage_process) -> Callable[..., subprocess.Popen]:
    """Start ``manage.py pgmb_dispatch`` as a real process against the test database."""
    # The second database's test name, for a test that asked for it (test_databases).
    second = {"PGMB_SECOND_DB_NAME": connections["second"].settings_dict["NAME"]}

    def start(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        return manage_process("pgmb_dispatch", *args, env={**second, **(extra_env or {})})

    return start
