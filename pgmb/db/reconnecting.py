"""Async database connections that survive outages: autocommit, re-established with
backoff (:mod:`.backoff`: at most half a second between attempts).

A lost connection never loses a message: deliveries are rows, and a lease that runs out
while the dispatcher cannot reach the database makes its deliveries claimable again.

Through a transaction pooler (:mod:`.pooler`) a connection keeps no session state: no
session settings, and no LISTEN (the dispatcher polls instead, and says so at start-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg.errors import Diagnostic

from .. import sql
from .backoff import Backoff
from .error_text import first_line
from .pooler import NO_LISTEN, AsyncPoolerAwareConnection, aconnect
from .statements import Call, arun

T = TypeVar("T")

log = logging.getLogger("pgmb.dispatch")

#: Seconds between two "still unavailable" warnings of one outage (every attempt would
#: be two lines a second).
WARN_EVERY = 30.0


class Unavailable(Exception):
    """The database could not be reached before the dispatcher gave up.

    Either it is shutting down, or it has a time limit (``--until-idle``) and the database
    stayed unreachable that long.
    """


class Database:
    """One autocommit connection that reconnects on failure and retries the call."""

    def __init__(
        self,
        conninfo: dict[str, Any],
        role: str,
        setup: str | None = None,
        interrupt: asyncio.Event | None = None,
        notices: Callable[[Diagnostic], None] | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._role = role
        #: Handed each NOTICE or WARNING the server raises on this connection.
        self._notices = notices
        #: Once set, a call that cannot reach the database gives up at once (a stop request
        #: must not wait for a database that may never come back).
        self._interrupt = interrupt
        #: Named query of ``dispatcher.sql`` run on each new connection (session settings),
        #: unless it goes through a pooler: a session setting would stay with the server
        #: connection, for the pooler's other clients, and not follow this one.
        self._setup = setup
        self._conn: AsyncPoolerAwareConnection | None = None
        #: When set (a time.monotonic() value), stop retrying once it has passed.
        self.give_up_at: float | None = None
        #: When set, stop retrying once the database has been unreachable this many seconds.
        self.give_up_after: float | None = None
        #: When the current outage began (time.monotonic()), None while connected.
        self._down_since: float | None = None
        self._backoff = Backoff()
        #: When this outage was last reported (time.monotonic()).
        self._warned_at = 0.0

    async def _connection(self) -> AsyncPoolerAwareConnection:
        if self._conn is None or self._conn.closed:
            conn = await aconnect(self._conninfo)
            if self._notices is not None:
                conn.add_notice_handler(self._notices)
            if self._setup and not conn.pooled:
                try:
                    await conn.execute(sql.query("dispatcher.sql", self._setup))
                except BaseException:
                    await conn.close()
                    raise
            self._conn = conn
            if self._down_since is not None:
                log.info(
                    "database reconnected role=%s after=%.1fs",
                    self._role,
                    time.monotonic() - self._down_since,
                )
                self._down_since = None
                self._backoff.reset()
        return self._conn

    async def run(self, call: Call[T]) -> T:
        """Run a state-machine call, reconnecting and retrying until the database answers."""
        while True:
            try:
                return await arun(await self._connection(), call)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                await self._drop()
                now = time.monotonic()
                delay = self._backoff.next()
                first = self._down_since is None
                if self._down_since is None:
                    self._down_since = now
                if (
                    self._interrupted()
                    or (self.give_up_at is not None and now + delay > self.give_up_at)
                    or (
                        self.give_up_after is not None
                        and now + delay - self._down_since > self.give_up_after
                    )
                ):
                    raise Unavailable(
                        f"unreachable for {now - self._down_since:.0f}s: {first_line(exc)}"
                    ) from exc
                if first or now - self._warned_at >= WARN_EVERY:
                    self._warned_at = now
                    log.warning(
                        "database unavailable role=%s for=%.0fs retrying_every<=%.1fs error=%r",
                        self._role,
                        now - self._down_since,
                        self._backoff.cap,
                        first_line(exc),
                    )
                if self._interrupt is None:
                    await asyncio.sleep(delay)
                else:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._interrupt.wait(), delay)
                    if self._interrupted():
                        raise Unavailable(str(exc)) from exc

    def _interrupted(self) -> bool:
        return self._interrupt is not None and self._interrupt.is_set()

    async def _drop(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):  # it is already broken
                await conn.close()

    async def close(self) -> None:
        await self._drop()


async def listen(
    conninfo: dict[str, Any],
    wake: asyncio.Event,
    poll_interval: float,
    deaf: asyncio.Event | None = None,
) -> None:
    """Set ``wake`` on every NOTIFY pgmb, forever; reconnect with backoff when cut off.

    After each (re)connection ``wake`` is set once, so whatever was published while no one
    was listening is claimed at once rather than at the next poll.

    Through a transaction pooler it says that the dispatcher polls every ``poll_interval``
    seconds instead, sets ``deaf`` and returns: a LISTEN would stay with a server connection
    the pooler hands to other clients, and this one would hear nothing.
    """
    backoff = Backoff()
    down_since: float | None = None
    warned_at = 0.0
    while True:
        try:
            conn = await aconnect(conninfo)
            try:
                if conn.pooled:
                    log.warning(
                        "%s: polling for new deliveries every %gs instead (--poll-interval, "
                        "PGMB['DISPATCH_POLL_INTERVAL'])",
                        NO_LISTEN,
                        poll_interval,
                    )
                    if deaf is not None:
                        deaf.set()
                    return
                await conn.execute(sql.query("dispatcher.sql", "listen"))
                wake.set()
                backoff.reset()
                if down_since is not None:
                    log.info("listener reconnected after=%.1fs", time.monotonic() - down_since)
                    down_since = None
                async for _ in conn.notifies():
                    wake.set()
            finally:
                await conn.close()
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            now = time.monotonic()
            if down_since is None or now - warned_at >= WARN_EVERY:
                warned_at = now
                log.warning(
                    "listener disconnected for=%.0fs error=%r",
                    now - (down_since or now),
                    first_line(exc),
                )
            if down_since is None:
                down_since = now
            await asyncio.sleep(backoff.next())
