"""Housekeeping of the hot table: ``pgmb_delivery``'s indexes back to size after a backlog.

A drained backlog leaves ``pgmb_delivery`` empty, and autovacuum gives its heap back to the
system, but not its indexes: a B-tree keeps its emptied pages for reuse, at the size the
backlog gave it (168 MB of indexes after a million deliveries, docs/benchmarks.md). Only a
rebuild returns them, and ``REINDEX ... CONCURRENTLY`` (which leaves writes alone) cannot
run inside a transaction block or a function: a client must send it.

:func:`ahousekeep` does, from cheap catalog figures: an index larger than
``min_index_bytes`` and more than ``bloat_factor`` times what the table's live rows need
(:data:`ROW_BYTES` each) is rebuilt. The invalid leftovers of an interrupted rebuild are
dropped first. One process at a time per database (an advisory lock); every failure is a
step of the report, never an exception, so that a dispatcher calling it goes on.

Through a transaction pooler (PgBouncer; :mod:`pgmb.db.pooler`) none of it runs
(:class:`ThroughPooler`): ``REINDEX ... CONCURRENTLY`` and ``VACUUM`` refuse a transaction,
so the lock that keeps housekeepers apart would be a session lock, and a pooler would leave
it, with ``lock_timeout``, on a server connection its other clients get.

Each run also removes the worker secrets whose retirement has expired
(``pgmb.forget_expired_secrets()``; docs/decisions/0038-secret-rotation.md), which sign
nothing any more, and makes the history's days ahead (:mod:`pgmb.history`): the pg_cron
path does both in ``pgmb.maintenance()``.

Who calls it: the external dispatcher once it has drained work (at most once per
``PGMB['HOUSEKEEPING_INTERVAL']`` seconds), and ``manage.py pgmb_housekeeping``.

:func:`avacuum` vacuums the table, under the same lock: the external dispatcher calls it
each time it has drained its work after claiming ``PGMB['HOUSEKEEPING_VACUUM_EVERY']``
deliveries, because the rows and index entries of finished deliveries, until a vacuum
removes them, are walked past by every claim: with autovacuum alone (once a minute at
most, by default), back-to-back drains slowed to a quarter of their speed
(docs/decisions/0009-a-small-hot-table-kept-small.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import class_row

from . import conf, sql
from .conf import DEFAULT_BLOAT_FACTOR, DEFAULT_MIN_INDEX_BYTES
from .db.conninfo import conninfo_from_django, direct_conninfo
from .db.error_text import first_line
from .db.pooler import AsyncPoolerAwareConnection, aconnect
from .db.statements import arun as arun_call
from .history import premake_call
from .worker_secrets import forget_expired_call

#: Bytes of index that one live delivery may need: the widest entry (pgmb_delivery_due,
#: 46 bytes of key and included columns, plus tuple header and line pointer) in a page kept
#: half full by splits, rounded up. Generous: only an index many times larger is rebuilt.
ROW_BYTES = 128


class ThroughPooler(Exception):
    """Housekeeping was asked of a connection that goes through a transaction pooler."""

    def __init__(self) -> None:
        super().__init__(
            "housekeeping needs a direct connection to PostgreSQL, and this one goes through "
            "a transaction pooler (such as PgBouncer): REINDEX CONCURRENTLY and VACUUM "
            "refuse a transaction, so the lock that keeps housekeepers apart would outlive "
            "it on a pooled server connection. Give the alias one that connects directly "
            "(PGMB['DIRECT_DATABASES']), or run manage.py pgmb_housekeeping --database with one"
        )


@dataclass(frozen=True)
class Thresholds:
    """When an index counts as bloated: larger than both figures."""

    #: Smaller indexes are left alone, however empty the table (a rebuild would gain little).
    min_index_bytes: int = DEFAULT_MIN_INDEX_BYTES
    #: How many times what the live rows need (live rows x :data:`ROW_BYTES`).
    bloat_factor: float = DEFAULT_BLOAT_FACTOR

    @classmethod
    def from_settings(cls) -> Thresholds:
        """The thresholds of ``PGMB`` (pgmb.conf)."""
        settings = conf.get()
        return cls(settings.HOUSEKEEPING_MIN_INDEX_BYTES, settings.HOUSEKEEPING_BLOAT_FACTOR)

    def bloated(self, index_bytes: int, live_rows: int) -> bool:
        """Whether an index of ``index_bytes`` is worth rebuilding over ``live_rows`` rows."""
        return (
            index_bytes > self.min_index_bytes
            and index_bytes > self.bloat_factor * live_rows * ROW_BYTES
        )


@dataclass(frozen=True)
class _Index:
    """A row of the query ``indexes``."""

    schema: str
    name: str
    bytes: int
    valid: bool
    leftover: bool
    live_rows: int


@dataclass(frozen=True)
class Step:
    """What was done (or would be, or failed) to one index."""

    index: str
    #: 'reindexed', 'dropped leftover', 'would reindex', 'would drop leftover', or 'failed'.
    action: str
    before: int
    #: Its size afterwards (None: not rebuilt; 0: dropped).
    after: int | None = None
    #: Why it failed (the server's first line).
    error: str = ""

    def describe(self) -> str:
        sizes = _mb(self.before) + (f" -> {_mb(self.after)}" if self.after is not None else "")
        return f"{self.action} {self.index} {sizes}" + (
            f" error={self.error!r}" if self.error else ""
        )


@dataclass(frozen=True)
class Report:
    """One run of :func:`ahousekeep`."""

    #: False: another process held the housekeeping lock, and nothing was looked at.
    ran: bool
    live_rows: int = 0
    steps: tuple[Step, ...] = ()
    #: Retiring worker secrets removed because they had expired (pgmb.forget_expired_secrets).
    expired_secrets: int = 0
    #: Why they could not be removed (the server's first line), if so.
    secrets_error: str = ""
    #: Day partitions of the history made ahead (pgmb.history.premake_call), and why not.
    history_days_made: int = 0
    history_error: str = ""

    @property
    def failed(self) -> list[Step]:
        return [step for step in self.steps if step.action == "failed"]

    def summary(self) -> str:
        if not self.ran:
            return "housekeeping skipped: another process holds its lock"
        if not self.steps:
            text = f"housekeeping: no index to rebuild (live rows {self.live_rows:,})"
        else:
            text = f"housekeeping (live rows {self.live_rows:,}): " + "; ".join(
                step.describe() for step in self.steps
            )
        if self.expired_secrets:
            text += f"; removed {self.expired_secrets} expired retiring secret(s)"
        if self.secrets_error:
            text += f"; expired retiring secrets not removed: error={self.secrets_error!r}"
        if self.history_days_made:
            text += f"; made {self.history_days_made} history partition(s) ahead"
        if self.history_error:
            text += f"; history partitions not made: error={self.history_error!r}"
        return text


def _mb(size: int) -> str:
    return f"{size / 1024 / 1024:.2f} MB"


async def _scalar(conn: psycopg.AsyncConnection[Any], query: Any, params: Any = None) -> Any:
    async with conn.cursor() as cursor:
        await cursor.execute(query, params)
        row = await cursor.fetchone()
        return row[0] if row else None


async def ahousekeep(
    conn: psycopg.AsyncConnection[Any],
    thresholds: Thresholds | None = None,
    *,
    dry_run: bool = False,
) -> Report:
    """Rebuild the bloated indexes of ``pgmb_delivery`` on ``conn`` (autocommit).

    Leftovers of an interrupted rebuild are dropped first; the first step that fails ends
    the run (the next one tries again). ``dry_run``: say what would be done, do nothing,
    take no lock. Sets the session's ``lock_timeout``.
    """
    if not conn.autocommit:
        raise ValueError("housekeeping needs an autocommit connection (REINDEX CONCURRENTLY)")
    thresholds = thresholds or Thresholds.from_settings()
    async with _locked(conn, take=not dry_run) as held:
        if not held:
            return Report(ran=False)
        expired, error = (0, "") if dry_run else await _forget_expired_secrets(conn)
        made, history_error = (0, "") if dry_run else await _premake_history(conn)
        report = await _look(conn, thresholds, dry_run)
        return replace(
            report,
            expired_secrets=expired,
            secrets_error=error,
            history_days_made=made,
            history_error=history_error,
        )


async def _premake_history(conn: psycopg.AsyncConnection[Any]) -> tuple[int, str]:
    """The history's days ahead (pgmb.history): how many tables were made, or why not."""
    try:
        return await arun_call(conn, premake_call()), ""
    except psycopg.Error as exc:
        return 0, first_line(exc)


async def _forget_expired_secrets(conn: psycopg.AsyncConnection[Any]) -> tuple[int, str]:
    """Remove the expired retiring secrets (they sign nothing any more, and a secret kept
    is a secret that can leak): how many, or why not."""
    try:
        return await arun_call(conn, forget_expired_call()), ""
    except psycopg.Error as exc:
        return 0, first_line(exc)


@contextlib.asynccontextmanager
async def _locked(conn: psycopg.AsyncConnection[Any], *, take: bool = True) -> AsyncIterator[bool]:
    """The housekeeping lock, with the session's settings: whether it is held (``take``
    False: neither asked nor set, and True)."""
    if not take:
        yield True
        return
    if not await _scalar(conn, sql.query("housekeeping.sql", "try_lock")):
        yield False
        return
    try:
        await conn.execute(sql.query("housekeeping.sql", "session"))
        yield True
    finally:
        if not conn.closed:
            with contextlib.suppress(psycopg.Error):  # the lock ends with the connection
                await conn.execute(sql.query("housekeeping.sql", "unlock"))


async def _look(
    conn: psycopg.AsyncConnection[Any], thresholds: Thresholds, dry_run: bool
) -> Report:
    """The indexes' sizes, then each leftover dropped and each bloated index rebuilt (or,
    ``dry_run``, said); the first failure ends the look."""
    async with conn.cursor(row_factory=class_row(_Index)) as cursor:
        await cursor.execute(sql.query("housekeeping.sql", "indexes"))
        indexes = await cursor.fetchall()
    live_rows = int(indexes[0].live_rows) if indexes else 0
    leftovers = [i for i in indexes if i.leftover]
    bloated = [i for i in indexes if i.valid and thresholds.bloated(i.bytes, live_rows)]
    steps: list[Step] = []
    for what, index in [("drop_leftover", i) for i in leftovers] + [
        ("reindex", i) for i in bloated
    ]:
        steps.append(await _act(conn, what, index, dry_run))
        if steps[-1].action == "failed":
            break  # a lock timeout or a lost connection would meet the others too
    return Report(ran=True, live_rows=live_rows, steps=tuple(steps))


#: Each statement's name in the report: done, and in a dry run.
_ACTIONS = {
    "drop_leftover": ("dropped leftover", "would drop leftover"),
    "reindex": ("reindexed", "would reindex"),
}


async def _act(conn: psycopg.AsyncConnection[Any], what: str, index: _Index, dry_run: bool) -> Step:
    schema, name, before = index.schema, index.name, index.bytes
    done, would = _ACTIONS[what]
    if dry_run:
        return Step(name, would, before)
    statement = pgsql.SQL(sql.query("housekeeping.sql", what)).format(
        index=pgsql.Identifier(schema, name)
    )
    try:
        await conn.execute(statement)
        if what == "drop_leftover":
            return Step(name, done, before, 0)
        after = await _scalar(
            conn, sql.query("housekeeping.sql", "size"), {"schema": schema, "name": name}
        )
        return Step(name, done, before, int(after or 0))
    except psycopg.Error as exc:
        # A lock timeout, a concurrent DDL, a lost connection, a missing privilege: an
        # outcome to report; what it left behind (an invalid copy) goes at the next run.
        return Step(name, "failed", before, error=first_line(exc))


async def arun(
    conninfo: dict[str, Any], thresholds: Thresholds | None = None, *, dry_run: bool = False
) -> Report:
    """:func:`ahousekeep` on a connection of its own, closed afterwards. Raises
    :class:`ThroughPooler` through a transaction pooler, unless ``dry_run`` (which only
    reads)."""
    async with await _direct(conninfo, dry_run=dry_run) as conn:
        return await ahousekeep(conn, thresholds, dry_run=dry_run)


async def _direct(conninfo: dict[str, Any], *, dry_run: bool = False) -> AsyncPoolerAwareConnection:
    """A connection for housekeeping; :class:`ThroughPooler` if it is pooled (and more than
    a dry run is asked)."""
    conn = await aconnect(conninfo)
    if conn.pooled and not dry_run:
        await conn.close()
        raise ThroughPooler
    return conn


async def avacuum(conninfo: dict[str, Any]) -> bool:
    """``VACUUM pgmb_delivery`` on a connection of its own, under the housekeeping lock;
    False if another process held the lock (nothing done). Raises psycopg's error.

    A role that does not own the table gets the server's warning and nothing is vacuumed.
    :class:`ThroughPooler` through a transaction pooler.
    """
    async with (
        await _direct(conninfo) as conn,
        _locked(conn) as held,
    ):
        if held:
            await conn.execute(sql.query("housekeeping.sql", "vacuum"))
        return held


def housekeep(
    alias: str | None = None, thresholds: Thresholds | None = None, *, dry_run: bool = False
) -> Report:
    """:func:`arun` for a Django database alias (default: ``PGMB['DATABASE']``; the alias
    ``PGMB['DIRECT_DATABASES']`` gives it, if any), blocking.

    Raises psycopg's error if the database cannot be reached or the lock not asked for,
    :class:`ThroughPooler` through a transaction pooler; everything after that is in the
    report.
    """
    alias = alias or conf.get().DATABASE
    conninfo = direct_conninfo(alias) or conninfo_from_django(alias)
    return asyncio.run(arun(conninfo, thresholds or Thresholds.from_settings(), dry_run=dry_run))
