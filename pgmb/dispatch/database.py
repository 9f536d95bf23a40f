"""The dispatcher's database connections: autocommit, re-established with backoff.

A lost connection never loses a message: deliveries are rows, and a lease that runs out
while the dispatcher cannot reach the database makes its deliveries claimable again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row

from .. import sql

log = logging.getLogger("pgmb.dispatch")

_BACKOFF_START = 0.1
_BACKOFF_MAX = 5.0


def conninfo_from_django(alias: str) -> dict[str, Any]:
    """psycopg connection arguments of a Django database alias."""
    from django.db import connections

    params = dict(connections[alias].get_connection_params())
    for django_only in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(django_only, None)
    return params


class Unavailable(Exception):
    """The database could not be reached before the dispatcher gave up (shutting down)."""


class Database:
    """One autocommit connection that reconnects on failure and retries the call."""

    def __init__(
        self,
        conninfo: dict[str, Any],
        role: str,
        setup: str | None = None,
        interrupt: asyncio.Event | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._role = role
        #: Once set, a call that cannot reach the database gives up at once (a stop request
        #: must not wait for a database that may never come back).
        self._interrupt = interrupt
        #: Named query of ``dispatcher.sql`` run on each new connection (session settings).
        self._setup = setup
        self._conn: psycopg.AsyncConnection | None = None
        #: When set (a time.monotonic() value), stop retrying once it has passed.
        self.give_up_at: float | None = None

    async def _connection(self) -> psycopg.AsyncConnection:
        if self._conn is None or self._conn.closed:
            conn = await psycopg.AsyncConnection.connect(**self._conninfo, autocommit=True)
            if self._setup:
                try:
                    await conn.execute(sql.query("dispatcher.sql", self._setup))
                except BaseException:
                    await conn.close()
                    raise
            self._conn = conn
        return self._conn

    async def fetch(self, name: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run the named query of ``dispatcher.sql``, retrying until the database answers."""
        query = sql.query("dispatcher.sql", name)
        delay = _BACKOFF_START
        while True:
            try:
                conn = await self._connection()
                async with conn.cursor(row_factory=namedtuple_row) as cursor:
                    await cursor.execute(query, params)
                    return await cursor.fetchall() if cursor.description else []
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                await self._drop()
                if self._interrupted() or (
                    self.give_up_at is not None and time.monotonic() + delay > self.give_up_at
                ):
                    raise Unavailable(str(exc)) from exc
                log.warning(
                    "database unavailable role=%s retry_in=%.1fs error=%r",
                    self._role,
                    delay,
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                )
                if self._interrupt is None:
                    await asyncio.sleep(delay)
                else:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._interrupt.wait(), delay)
                    if self._interrupted():
                        raise Unavailable(str(exc)) from exc
                delay = min(delay * 2, _BACKOFF_MAX)

    def _interrupted(self) -> bool:
        return self._interrupt is not None and self._interrupt.is_set()

    async def scalar(self, name: str, params: Sequence[Any] = ()) -> Any:
        rows = await self.fetch(name, params)
        return rows[0][0] if rows else None

    async def _drop(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):  # it is already broken
                await conn.close()

    async def close(self) -> None:
        await self._drop()


async def listen(conninfo: dict[str, Any], wake: asyncio.Event) -> None:
    """Set ``wake`` on every NOTIFY pgmb, forever; reconnect with backoff when cut off.

    After each (re)connection ``wake`` is set once, so whatever was published while no one
    was listening is claimed at once rather than at the next poll.
    """
    delay = _BACKOFF_START
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(**conninfo, autocommit=True)
            try:
                await conn.execute(sql.query("dispatcher.sql", "listen"))
                wake.set()
                delay = _BACKOFF_START
                async for _ in conn.notifies():
                    wake.set()
            finally:
                await conn.close()
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            log.warning("listener disconnected retry_in=%.1fs error=%r", delay, str(exc).strip())
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX)
