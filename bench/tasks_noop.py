"""The no-op task of bench/tasks.py, as each system declares it.

Running it appends one line, ``<n> <start time>``, to a file of this process
(``$PGMB_BENCH_TASKS_RUNS/<pid>.log``, line-buffered, never synced): the benchmark counts
the runs of each task from these lines (lost, or run twice) and times the worker between
them, with no statement of the task's own in the database it measures.
"""

from __future__ import annotations

import os
import time
from typing import IO

SYSTEM = os.environ.get("PGMB_BENCH_TASKS_SYSTEM", "pgmb")

_log: IO[str] | None = None


def record(n: int) -> None:
    """What every system's task does: note that task ``n`` started, and when."""
    global _log
    started = time.time()
    if _log is None:
        path = os.path.join(os.environ["PGMB_BENCH_TASKS_RUNS"], f"{os.getpid()}.log")
        _log = open(path, "a", buffering=1, encoding="ascii")  # noqa: SIM115 (kept open)
    _log.write(f"{n} {started:.6f}\n")


if SYSTEM == "procrastinate":
    from procrastinate.contrib.django import app

    @app.task(name="bench_noop")
    def noop(n: int) -> None:
        record(n)

else:
    try:
        from django.tasks import task  # Django 6
    except ImportError:
        from django_tasks import task  # type: ignore[no-redef]  # Django 5.2: the backport

    @task()
    def noop(n: int) -> None:
        record(n)
