"""Fixtures of the Spark pipeline's tests.

Spark reads and writes through its own JDBC connections, so these tests commit their data
(``transactional_db``). Jobs run through ``manage.py pgmb_pipeline`` on ``local[2]``.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
from django.core.management import call_command

#: Two cores on these machines: local[2] keeps a job's tasks from queueing behind each other.
MASTER = "local[2]"


@pytest.fixture
def run_pipeline(transactional_db) -> Callable[..., str]:
    """Run ``manage.py pgmb_pipeline JOB ARGS…`` on the test database; its report."""

    def run(job: str, *args: str) -> str:
        out = io.StringIO()
        call_command("pgmb_pipeline", job, "--master", MASTER, *args, stdout=out)
        return out.getvalue()

    return run
