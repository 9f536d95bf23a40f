"""Connections that know whether they go through a transaction pooler (PgBouncer), and
behave on one.

A pooler in transaction mode hands each transaction of a client to whichever server
connection is free: what a client leaves on a server connection (a prepared statement, a
session setting, a session advisory lock, a LISTEN) meets other clients, and what it set
up before may be gone at its next statement. Such a pooler cannot give a client the cancel
key of a server process, since it has none of its own: it sends one it made up, whose
process id is no server's. So a connection is *pooled* when the process id of its
start-up (``info.backend_pid``) is not the one ``pg_backend_pid()`` answers: one round
trip at connect, nothing to configure (docs/decisions/0045-a-pooler-is-detected-at-connect.md). A
TCP proxy that forwards a whole session passes the real key on, and is rightly not
counted: the session is the server's.

On a pooled connection psycopg prepares no statement (``prepare_threshold`` None), unless
the database's ``OPTIONS`` name a threshold (a pooler that tracks prepared statements,
such as PgBouncer 1.21 and later with ``max_prepared_statements``): then that one, as
everywhere. A direct connection keeps psycopg's default: the dispatcher's claims are
prepared after a few runs.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import TupleRow

#: The connection argument of psycopg's prepared statements.
PREPARE_THRESHOLD = "prepare_threshold"

#: The process id of the server process this statement runs in.
_SERVER_PID = "SELECT pg_backend_pid()"

#: What pgmb does not do through a pooler, and what it does instead: one sentence for the
#: processes' start-up lines and errors.
NO_LISTEN = (
    "the database connection goes through a transaction pooler (such as PgBouncer): "
    "LISTEN is unavailable there"
)


class PoolerAwareConnection(psycopg.Connection[TupleRow]):
    """A psycopg connection that knows whether a pooler is in between (:func:`connect`)."""

    #: Whether the connection goes through a transaction pooler.
    pooled: bool = False


class AsyncPoolerAwareConnection(psycopg.AsyncConnection[TupleRow]):
    """The asynchronous :class:`PoolerAwareConnection` (:func:`aconnect`)."""

    pooled: bool = False


def _pooled(announced_pid: int, server_pid: Any) -> bool:
    return server_pid is None or int(server_pid) != announced_pid


def _prepare(conn: psycopg.BaseConnection[Any], conninfo: dict[str, Any]) -> None:
    if PREPARE_THRESHOLD not in conninfo:
        # Prepared on one server connection, run on another (or meeting another client's
        # statement of the same name): "prepared statement does not exist", or the wrong
        # statement.
        conn.prepare_threshold = None


def connect(conninfo: dict[str, Any]) -> PoolerAwareConnection:
    """An autocommit connection with ``conninfo`` (psycopg's arguments), told whether it
    is pooled; raises psycopg's error."""
    conn = PoolerAwareConnection.connect(**conninfo, autocommit=True)
    try:
        row = conn.execute(_SERVER_PID).fetchone()
    except BaseException:
        conn.close()
        raise
    conn.pooled = _pooled(conn.info.backend_pid, row[0] if row else None)
    if conn.pooled:
        _prepare(conn, conninfo)
    return conn


async def aconnect(conninfo: dict[str, Any]) -> AsyncPoolerAwareConnection:
    """:func:`connect`, asynchronous."""
    conn = await AsyncPoolerAwareConnection.connect(**conninfo, autocommit=True)
    try:
        row = await (await conn.execute(_SERVER_PID)).fetchone()
    except BaseException:
        await conn.close()
        raise
    conn.pooled = _pooled(conn.info.backend_pid, row[0] if row else None)
    if conn.pooled:
        _prepare(conn, conninfo)
    return conn
