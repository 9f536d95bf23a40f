"""Pull queues: clients read a queue that has no worker, SQS/PGMQ style.

A pull queue is a :class:`~pgmb.models.Queue` whose ``worker`` is None. Its messages are
read with a visibility timeout, then deleted (acknowledged), archived, failed (``nack``)
or left to become visible again. Each function here runs one function of schema ``pgmb``
(pgmb/sql/schema/pull.sql) from ``pgmb/sql/queries/pull.sql``, so SQL clients and Python get the
same semantics and the same errors::

    from pgmb import pull
    for message in pull.read("reports", vt=30, qty=10):
        build(message.body)
        pull.delete("reports", [message.id])

The synchronous functions run on a Django connection, in the caller's transaction. The
``*_call`` functions build the statements (:class:`pgmb.db.statements.Call`) for callers
that run them another way, such as :class:`pgmb.consume.Consumer` on its own connection.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from . import sql
from .db.statements import Call, run
from .db.values import count, jsonb, scalar, storable


@dataclass(frozen=True, slots=True)
class Message:
    """One message as a read returned it (PGMQ's ``message_record``, and a bit more)."""

    #: The handle for :func:`delete`, :func:`archive`, :func:`set_vt`: the delivery's id
    #: (PGMQ's ``msg_id``).
    id: int
    #: The published message's id, the same in every queue it was routed to.
    message_id: uuid.UUID
    #: How many times it has been read, this read included (the delivery's attempts).
    read_ct: int
    enqueued_at: datetime
    #: When it becomes visible again unless deleted first.
    vt: datetime
    body: Any
    headers: dict[str, Any]
    routing_key: str


def _statement(name: str) -> str:
    return sql.query("pull.sql", name)


#: The columns of a message as a read returns it (the type pgmb.pull_message), in order.
MESSAGE_COLUMNS = (
    "delivery_id",
    "message_id",
    "read_ct",
    "enqueued_at",
    "vt",
    "body",
    "headers",
    "routing_key",
)


def message_of(values: Sequence[Any]) -> Message:
    """A read message from its columns, in the order of :data:`MESSAGE_COLUMNS`."""
    delivery_id, message_id, read_ct, enqueued_at, vt, body, headers, routing_key = values
    return Message(
        id=delivery_id,
        message_id=message_id,
        read_ct=read_ct,
        enqueued_at=enqueued_at,
        vt=vt,
        body=jsonb(body),
        headers=jsonb(headers),
        routing_key=routing_key,
    )


def _messages(names: list[str], rows: list[tuple[Any, ...]]) -> list[Message]:
    out = []
    for row in rows:
        values = dict(zip(names, row, strict=True))
        out.append(message_of([values[column] for column in MESSAGE_COLUMNS]))
    return out


def _id_list(names: list[str], rows: list[tuple[Any, ...]]) -> list[int]:
    return list(rows[0][0]) if rows else []


def _filter(filter: Any) -> Jsonb | None:
    return None if filter is None else Jsonb(filter)


def _handles(ids: int | Iterable[int] | Iterable[Message]) -> list[int]:
    if isinstance(ids, int):
        return [ids]
    return [i.id if isinstance(i, Message) else i for i in ids]


def read_call(queue: str, vt: float, qty: int = 1, filter: Any = None) -> Call[list[Message]]:
    return Call(
        _statement("read"),
        {"queue": queue, "vt": vt, "qty": qty, "filter": _filter(filter)},
        _messages,
    )


def read_with_poll_call(
    queue: str,
    vt: float,
    qty: int = 1,
    max_poll_seconds: float = 5,
    poll_interval_ms: int = 100,
    filter: Any = None,
) -> Call[list[Message]]:
    return Call(
        _statement("read_with_poll"),
        {
            "queue": queue,
            "vt": vt,
            "qty": qty,
            "max_poll_seconds": max_poll_seconds,
            "poll_interval_ms": poll_interval_ms,
            "filter": _filter(filter),
        },
        _messages,
    )


def pop_call(queue: str, qty: int = 1) -> Call[list[Message]]:
    return Call(_statement("pop"), {"queue": queue, "qty": qty}, _messages)


def set_vt_call(
    queue: str, ids: int | Iterable[int] | Iterable[Message], vt: float
) -> Call[list[Message]]:
    return Call(_statement("set_vt"), {"queue": queue, "ids": _handles(ids), "vt": vt}, _messages)


def delete_call(queue: str, ids: int | Iterable[int] | Iterable[Message]) -> Call[list[int]]:
    return Call(_statement("delete"), {"queue": queue, "ids": _handles(ids)}, _id_list)


def archive_call(queue: str, ids: int | Iterable[int] | Iterable[Message]) -> Call[list[int]]:
    return Call(_statement("archive"), {"queue": queue, "ids": _handles(ids)}, _id_list)


def nack_call(queue: str, messages: Sequence[Message], errors: Sequence[str]) -> Call[int]:
    return Call(
        _statement("nack"),
        {
            "queue": queue,
            "ids": [m.id for m in messages],
            "read_counts": [m.read_ct for m in messages],
            "errors": [storable(e) for e in errors],
        },
        count,
    )


def purge_call(queue: str) -> Call[int]:
    return Call(_statement("purge"), {"queue": queue}, count)


def next_visible_call(queue: str) -> Call[float | None]:
    return Call(_statement("next_visible"), {"queue": queue}, scalar)


def queue_lease_call(queue: str) -> Call[float]:
    return Call(_statement("queue_lease"), {"queue": queue}, scalar)


# The synchronous API (a Django connection, the caller's transaction).


def read(
    queue: str, vt: float, qty: int = 1, filter: Any = None, *, using: str | None = None
) -> list[Message]:
    """Read up to ``qty`` visible messages of the pull queue ``queue``, oldest first.

    Each becomes invisible for ``vt`` seconds (0 to 30 days) and its read count goes up;
    one not deleted in time is visible again, to any reader, at once. A message read
    ``1 + max_retries`` times and never deleted is dead-lettered instead of read again.
    ``filter`` is a JSON object ``{"body": ..., "headers": {...}}``: only messages whose
    body contains ``body`` and whose headers contain ``headers`` (jsonb ``@>``) are read.
    A paused queue reads nothing.
    """
    return run(read_call(queue, vt, qty, filter), using)


def read_with_poll(
    queue: str,
    vt: float,
    qty: int = 1,
    max_poll_seconds: float = 5,
    poll_interval_ms: int = 100,
    filter: Any = None,
    *,
    using: str | None = None,
) -> list[Message]:
    """:func:`read`, polling in the server every ``poll_interval_ms`` until a message comes
    or ``max_poll_seconds`` pass (``pgmb.read_with_poll``). :class:`pgmb.consume.Consumer`
    waits for publishers' notifications instead."""
    return run(
        read_with_poll_call(queue, vt, qty, max_poll_seconds, poll_interval_ms, filter), using
    )


def pop(queue: str, qty: int = 1, *, using: str | None = None) -> list[Message]:
    """Read and delete up to ``qty`` messages at once (at-most-once)."""
    return run(pop_call(queue, qty), using)


def set_vt(
    queue: str,
    ids: int | Iterable[int] | Iterable[Message],
    vt: float,
    *,
    using: str | None = None,
) -> list[Message]:
    """Make messages visible again in ``vt`` seconds from now (0: at once); returns them."""
    return run(set_vt_call(queue, ids, vt), using)


def delete(
    queue: str, ids: int | Iterable[int] | Iterable[Message], *, using: str | None = None
) -> list[int]:
    """Acknowledge messages: they leave the queue ('ack' in the history). Returns the ids
    deleted; an id already settled is skipped, an id of another queue is an error."""
    return run(delete_call(queue, ids), using)


def archive(
    queue: str, ids: int | Iterable[int] | Iterable[Message], *, using: str | None = None
) -> list[int]:
    """Settle messages like :func:`delete`, recorded as 'archived' instead of 'ack'."""
    return run(archive_call(queue, ids), using)


def nack(
    queue: str,
    messages: Sequence[Message],
    errors: Sequence[str] | str = "",
    *,
    using: str | None = None,
) -> int:
    """Record failed handlings: each message becomes visible again after the queue's
    backoff, or is dead-lettered if that was its read number ``1 + max_retries``.

    Fenced by the read count: a message read again since is left alone. Returns how many
    were recorded.
    """
    if isinstance(errors, str):
        errors = [errors] * len(messages)
    return run(nack_call(queue, messages, errors), using) if messages else 0


def purge(queue: str, *, using: str | None = None) -> int:
    """Delete every message of the pull queue (nothing goes to the history)."""
    return run(purge_call(queue), using)


def next_visible(queue: str, *, using: str | None = None) -> float | None:
    """Seconds until a message of ``queue`` is visible (0: now); None when it is empty or
    paused."""
    return run(next_visible_call(queue), using)
