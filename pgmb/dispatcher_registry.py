"""Running dispatchers, as an operator sees them: each registers, heartbeats, and says
when it stops.

Every call is one SQL function of schema ``pgmb`` (``pgmb.dispatcher_start``, ``_beat``,
``_stop``; the view ``pgmb.dispatchers``), with its statement in
``pgmb/sql/queries/dispatchers.sql``, run like the state machine's calls
(:mod:`pgmb.deliveries`): on a Django connection here, or as
:class:`~pgmb.db.statements.Call` objects on a dispatcher's own connection. A dispatcher
is *running*, *gone* (no heartbeat for :data:`GONE_AFTER` seconds: killed, or cut off
from the database) or *stopped* (it said so).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import sql
from .db.statements import Call, run
from .db.values import scalar

#: Seconds without a heartbeat after which a dispatcher is shown as gone
#: (``pgmb.dispatcher_state``); heartbeats come at most a third as far apart.
GONE_AFTER = 60.0

EXTERNAL = "external"
IN_DATABASE = "in_database"
#: A pull queue's consumer (manage.py pgmb_consume, pgmb.consume): woken like an
#: external dispatcher, it dispatches nothing.
CONSUMER = "consumer"


@dataclass(frozen=True, slots=True)
class DispatcherInfo:
    """One registered dispatcher, with its counters as of its last heartbeat."""

    id: int
    kind: str
    host: str
    pid: int
    #: The queues it dispatches; None: all.
    queues: list[str] | None
    started_at: datetime.datetime
    heartbeat_at: datetime.datetime
    stopped_at: datetime.datetime | None
    #: running, gone or stopped.
    state: str
    in_flight: int
    delivered: int
    failed: int


def _statement(name: str) -> str:
    return sql.query("dispatchers.sql", name)


def _flag(names: list[str], rows: list[tuple[Any, ...]]) -> bool:
    return bool(scalar(names, rows))


def _infos(names: list[str], rows: list[tuple[Any, ...]]) -> list[DispatcherInfo]:
    return [DispatcherInfo(**dict(zip(names, row, strict=True))) for row in rows]


def start_call(kind: str, host: str, pid: int, queues: Iterable[str] | None = None) -> Call[int]:
    return Call(
        _statement("start"),
        {
            "kind": kind,
            "host": host,
            "pid": pid,
            "queues": None if queues is None else list(queues),
        },
        lambda names, rows: int(scalar(names, rows)),
    )


def beat_call(dispatcher_id: int, in_flight: int, delivered: int, failed: int) -> Call[bool]:
    return Call(
        _statement("beat"),
        {"id": dispatcher_id, "in_flight": in_flight, "delivered": delivered, "failed": failed},
        _flag,
    )


def stop_call(dispatcher_id: int, delivered: int, failed: int) -> Call[bool]:
    return Call(
        _statement("stop"),
        {"id": dispatcher_id, "delivered": delivered, "failed": failed},
        _flag,
    )


def idle_call(dispatcher_id: int) -> Call[bool]:
    """Mark the dispatcher waiting for a NOTIFY; True once every publisher sees the mark
    (no message insert was in flight), False if it should claim again shortly and ask
    once more (``pgmb.dispatcher_idle`` in pgmb/sql/schema/dispatchers.sql)."""
    return Call(_statement("idle"), {"id": dispatcher_id}, _flag)


def busy_call(dispatcher_id: int) -> Call[None]:
    """Clear the mark: the dispatcher claims again without being woken."""
    return Call(_statement("busy"), {"id": dispatcher_id}, lambda names, rows: None)


def list_call(at: datetime.datetime | None = None) -> Call[list[DispatcherInfo]]:
    return Call(_statement("list"), {"at": at}, _infos)


# The synchronous API (a Django connection, the caller's transaction).


def start(
    kind: str, host: str, pid: int, queues: Iterable[str] | None = None, *, using: str | None = None
) -> int:
    """Register a dispatcher (``external``, ``in_database`` or ``consumer``); returns its id."""
    return run(start_call(kind, host, pid, queues), using)


def beat(
    dispatcher_id: int,
    in_flight: int = 0,
    delivered: int = 0,
    failed: int = 0,
    *,
    using: str | None = None,
) -> bool:
    """Record a heartbeat and the counters; False if the dispatcher is not registered (its
    row was removed, or it was stopped): it should register again."""
    return run(beat_call(dispatcher_id, in_flight, delivered, failed), using)


def stop(
    dispatcher_id: int, delivered: int = 0, failed: int = 0, *, using: str | None = None
) -> bool:
    """Mark a dispatcher stopped, with its last counters; False if it was not running."""
    return run(stop_call(dispatcher_id, delivered, failed), using)


def dispatchers(
    at: datetime.datetime | None = None, *, using: str | None = None
) -> list[DispatcherInfo]:
    """Every registered dispatcher, newest first, with its state as seen at ``at`` (now)."""
    return run(list_call(at), using)
