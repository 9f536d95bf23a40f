"""Tasks of the tests, defined the way a project defines its own (module level, @task)."""

from __future__ import annotations

import os
from pathlib import Path

from django_tasks import TaskContext, task


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="emails")
def greet(name: str, *, greeting: str = "hello") -> dict:
    return {"text": f"{greeting}, {name}", "pid": os.getpid()}


@task
def explode(message: str) -> None:
    raise ValueError(message)


@task(takes_context=True)
def flaky(context: TaskContext, succeed_on: int) -> int:
    """Fails until attempt ``succeed_on``, then returns the attempt's number."""
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt


@task
def touch(path: str) -> str:
    """Appends a line to ``path``: how many times a task ran, seen from outside."""
    with Path(path).open("a") as f:
        f.write("ran\n")
    return path


@task
def returns_set() -> object:
    return {1, 2}


@task
async def add_async(a: int, b: int) -> int:
    return a + b


@task(backend="immediate")
def elsewhere() -> int:
    return 1


@task
def lose_connection(marker: str) -> int:
    """Succeeds after the database ended the worker's connection (the first time only:
    ``marker`` is the file that says it did), so the worker's next statement fails."""
    import psycopg
    from django.db import connection

    from pgmb.db.conninfo import conninfo_from_django

    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    if Path(marker).exists():
        return pid
    Path(marker).touch()
    # From a session of its own, waiting (up to 10 s) until the backend is gone.
    with psycopg.connect(**conninfo_from_django("default"), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
    return pid
