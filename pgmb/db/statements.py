"""One SQL statement, its parameters and how to read its rows, run wherever it is needed.

A :class:`Call` is built once by the module that owns the statement (the state machine,
pull queues, breakers …) and run by whoever holds a connection: :func:`run` on a Django
connection, inside the caller's transaction; :func:`run_on` on a psycopg connection;
:func:`arun` on a psycopg ``AsyncConnection`` (the external dispatcher).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db import connections

from .. import conf

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One statement, its parameters, and how to read its result."""

    query: str
    params: dict[str, Any]
    #: Turns (column names, rows) into the result.
    read: Callable[[list[str], list[tuple[Any, ...]]], T]


def execute(cursor: Any, call: Call[T]) -> T:
    """Run a call on an open (synchronous) cursor, Django's or psycopg's."""
    cursor.execute(call.query, call.params)
    if cursor.description is None:
        return call.read([], [])
    return call.read([c.name for c in cursor.description], cursor.fetchall())


def run(call: Call[T], using: str | None = None) -> T:
    """Run a call on a Django connection (``using``; None: pgmb's DATABASE setting), in
    the caller's transaction."""
    if using is None:
        using = conf.get().DATABASE
    with connections[using].cursor() as cursor:
        return execute(cursor, call)


def run_on(conn: Any, call: Call[T]) -> T:
    """Run a call on a psycopg (synchronous) ``Connection``."""
    with conn.cursor() as cursor:
        return execute(cursor, call)


async def arun(conn: Any, call: Call[T]) -> T:
    """Run a call on a psycopg ``AsyncConnection``."""
    async with conn.cursor() as cursor:
        await cursor.execute(call.query, call.params)
        if cursor.description is None:
            return call.read([], [])
        return call.read([c.name for c in cursor.description], await cursor.fetchall())
