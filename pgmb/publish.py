"""Publishing: ``send`` and ``send_batch``.

Both run inside the caller's transaction, on the caller's connection: a message sent in a
``transaction.atomic()`` block that rolls back was never published (transactional outbox).
Routing happens in the database, by the statement-level trigger on ``pgmb_message``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Union

from django.db import IntegrityError, connections

from . import conf, sql
from .durations import check_seconds
from .errors import DuplicateMessage, InvalidBody, InvalidDelay
from .ids import uuid7
from .routing import validate_routing_key

#: Seconds, a ``timedelta``, or an aware ``datetime`` (not delivered before then).
Delay = Union[int, float, timedelta, datetime, None]  # noqa: UP007  (a runtime alias on 3.10)


@dataclass(frozen=True)
class Outgoing:
    """One message for :func:`send_batch`; mappings with these keys are accepted too."""

    routing_key: str
    body: Any
    headers: Mapping[str, Any] | None = None
    delay: Delay = None
    message_id: uuid.UUID | str | None = None


def _dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(value, cls=conf.get().json_encoder, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidBody(f"the message {what} cannot be stored as JSON: {exc}") from exc


def _headers(headers: Mapping[str, Any] | None) -> str:
    if headers is None:
        return "{}"
    if not isinstance(headers, Mapping):
        raise InvalidBody(f"message headers must be a mapping, not {type(headers).__name__}")
    return _dumps(dict(headers), "headers")


def _delay(delay: Delay) -> tuple[float | None, datetime | None]:
    """Split a delay into (seconds from the database's now(), absolute time)."""
    if delay is None:
        return None, None
    if isinstance(delay, datetime):
        if delay.tzinfo is None or delay.utcoffset() is None:
            raise InvalidDelay(f"delay {delay.isoformat()} must be timezone-aware")
        return None, delay
    if isinstance(delay, timedelta):
        delay = delay.total_seconds()
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        raise InvalidDelay(f"delay must be seconds, a timedelta or an aware datetime: {delay!r}")
    # The delay rule (finite, not negative, ending before the year 10000), as in
    # pgmb.check_delay() in SQL.
    return check_seconds(delay), None


def _message_id(message_id: uuid.UUID | str | None) -> uuid.UUID:
    if message_id is None:
        return uuid7()
    try:
        return message_id if isinstance(message_id, uuid.UUID) else uuid.UUID(str(message_id))
    except ValueError as exc:
        raise InvalidBody(f"message id {message_id!r} is not a UUID") from exc


def _duplicate(exc: IntegrityError) -> DuplicateMessage | None:
    diag = getattr(exc.__cause__, "diag", None)
    if diag is not None and diag.constraint_name == "pgmb_message_pkey":
        return DuplicateMessage(f"a message with this id already exists: {diag.message_detail}")
    return None


def send(
    routing_key: str,
    body: Any,
    *,
    headers: Mapping[str, Any] | None = None,
    delay: Delay = None,
    message_id: uuid.UUID | str | None = None,
    using: str | None = None,
) -> uuid.UUID:
    """Publish one message and return its id. One query, in the caller's transaction.

    ``body`` is anything JSON-serialisable (with ``PGMB['JSON_ENCODER']``); ``headers`` a
    mapping passed on to the worker; ``delay`` seconds, a ``timedelta`` or an aware
    ``datetime`` before which the message is not delivered.

    Raises :class:`~pgmb.errors.InvalidRoutingKey`, :class:`~pgmb.errors.InvalidBody`,
    :class:`~pgmb.errors.InvalidDelay` before touching the database, and
    :class:`~pgmb.errors.DuplicateMessage` if ``message_id`` is taken.
    """
    validate_routing_key(routing_key)
    mid = _message_id(message_id)
    seconds, at = _delay(delay)
    params = (mid, routing_key, _dumps(body, "body"), _headers(headers), at, seconds)
    try:
        with connections[using or conf.get().DATABASE].cursor() as cursor:
            cursor.execute(sql.query("publish.sql", "send"), params)
    except IntegrityError as exc:
        raise (_duplicate(exc) or exc) from exc
    return mid


def unrouted(
    message_ids: Iterable[uuid.UUID | str], *, using: str | None = None
) -> list[uuid.UUID]:
    """The messages among ``message_ids`` that no queue got, in the order given.

    Routing happens once, when a message is published: one whose routing key matched no
    queue's binding key at that moment is stored but never delivered (a typo in the key, a
    queue created later, a binding that does not cover it). One query::

        ids = pgmb.send_batch(messages)
        if lost := pgmb.unrouted(ids):
            log.warning("%d messages matched no queue", len(lost))

    Ids of messages that do not exist are not returned.
    """
    ids = [_message_id(i) for i in message_ids]
    if not ids:
        return []
    with connections[using or conf.get().DATABASE].cursor() as cursor:
        cursor.execute(sql.query("publish.sql", "unrouted"), (ids,))
        return [row[0] for row in cursor.fetchall()]


def _outgoing(item: Outgoing | Mapping[str, Any] | tuple) -> Outgoing:
    if isinstance(item, Outgoing):
        return item
    if isinstance(item, Mapping):
        unknown = set(item) - {"routing_key", "body", "headers", "delay", "message_id"}
        if unknown or "routing_key" not in item or "body" not in item:
            raise InvalidBody(
                "each message needs 'routing_key' and 'body' (optional: headers, delay, "
                f"message_id); got keys {sorted(item)}"
            )
        return Outgoing(**item)
    if isinstance(item, tuple) and len(item) == 2:
        return Outgoing(item[0], item[1])
    raise InvalidBody(f"cannot publish {type(item).__name__}: use pgmb.Outgoing, a dict or a pair")


def send_batch(
    messages: Iterable[Outgoing | Mapping[str, Any] | tuple[str, Any]],
    *,
    using: str | None = None,
) -> list[uuid.UUID]:
    """Publish many messages in one INSERT (one round trip); return their ids in order.

    Items are :class:`Outgoing`, mappings with the same keys, or ``(routing_key, body)``
    pairs. Every item is validated before anything is written: one bad item publishes none.
    """
    columns: tuple[list, ...] = ([], [], [], [], [], [])
    for item in messages:
        out = _outgoing(item)
        validate_routing_key(out.routing_key)
        seconds, at = _delay(out.delay)
        row = (
            _message_id(out.message_id),
            out.routing_key,
            _dumps(out.body, "body"),
            _headers(out.headers),
            at,
            seconds,
        )
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    if not columns[0]:
        return []
    try:
        with connections[using or conf.get().DATABASE].cursor() as cursor:
            cursor.execute(sql.query("publish.sql", "send_batch"), columns)
    except IntegrityError as exc:
        raise (_duplicate(exc) or exc) from exc
    return columns[0]
