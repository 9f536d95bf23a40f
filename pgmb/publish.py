"""Publishing: ``send`` and ``send_batch``.

Both run inside the caller's transaction, on the caller's connection: a message sent in a
``transaction.atomic()`` block that rolls back was never published (transactional outbox).
Routing happens in the database, by the statement-level trigger on ``pgmb_message``.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Union

from django.db import IntegrityError, OperationalError, connections

from . import conf, sql, tracing
from .durations import check_seconds, check_time
from .errors import DuplicateMessage, InvalidBody, InvalidDelay, UnknownDependency
from .ids import uuid7
from .message_limits import body_problem, headers_problem
from .options import Options, check_expiry, check_options, check_unique_key
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
    #: The message options of :func:`send` (docs/ordering.md).
    priority: int = 0
    group: str | None = None
    depends_on: Iterable[uuid.UUID | str] | None = None
    dedup_id: str | None = None
    max_retries: int | None = None
    retry_delay: float | timedelta | None = None
    #: Its expiry (docs/delivery.md, Expiry): seconds from publication, or a time.
    ttl: float | timedelta | None = None
    expires_at: datetime | None = None
    #: Unique while live (docs/publishing.md): its key, and ``'skip'`` or ``'replace'``.
    unique_key: str | None = None
    on_duplicate: str = "skip"


_FIELDS = frozenset(Outgoing.__dataclass_fields__)


def _body(body: Any) -> str:
    problem = body_problem(body)
    if problem is not None:
        raise InvalidBody(f"message refused: {problem}")
    return _dumps(body, "body")


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
    problem = headers_problem(headers)
    if problem is not None:
        raise InvalidBody(f"message refused: {problem}")
    return _dumps(dict(headers), "headers")


def _delay(delay: Delay) -> tuple[float | None, datetime | None]:
    """Split a delay into (seconds from the database's now(), absolute time)."""
    if delay is None:
        return None, None
    if isinstance(delay, datetime):
        # The time rule (aware, within the years 1 to 9999 in UTC), as pgmb.valid_time() in SQL.
        return None, check_time(delay)
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


#: The message table's key as a unique violation names it: the index of the partition the
#: id went to (its day's, the far or the default partition's; docs/decisions/0076), or the
#: parent's.
_MESSAGE_KEY = re.compile(r"pgmb_message(?:_default|_far|_p[0-9]{8})?_pkey")


def _duplicate(exc: IntegrityError) -> DuplicateMessage | UnknownDependency | None:
    diag = getattr(exc.__cause__, "diag", None)
    if diag is not None and _MESSAGE_KEY.fullmatch(diag.constraint_name or ""):
        return DuplicateMessage(f"a message with this id already exists: {diag.message_detail}")
    if (
        diag is not None
        and diag.sqlstate == "23503"
        and "depends on" in (diag.message_primary or "")
    ):
        return UnknownDependency(diag.message_primary)
    return None


def _option_params(options: Options) -> tuple[Any, ...]:
    return (
        options.priority,
        options.group,
        options.depends_on,
        options.dedup_id,
        options.max_retries,
        options.retry_delay,
    )


def send(
    routing_key: str,
    body: Any,
    *,
    headers: Mapping[str, Any] | None = None,
    delay: Delay = None,
    message_id: uuid.UUID | str | None = None,
    priority: int = 0,
    group: str | None = None,
    depends_on: Iterable[uuid.UUID | str] | None = None,
    dedup_id: str | None = None,
    max_retries: int | None = None,
    retry_delay: float | timedelta | None = None,
    ttl: float | timedelta | None = None,
    expires_at: datetime | None = None,
    unique_key: str | None = None,
    on_duplicate: str = "skip",
    using: str | None = None,
) -> uuid.UUID:
    """Publish one message and return its id. One query, in the caller's transaction.

    ``body`` is anything JSON-serialisable (with ``PGMB['JSON_ENCODER']``); ``headers`` a
    mapping passed on to the worker; ``delay`` seconds, a ``timedelta`` or an aware
    ``datetime`` before which the message is not delivered.

    The message options (docs/ordering.md): ``priority`` (lower first, 0 by default);
    ``group``, whose messages a queue delivers one at a time in publish order;
    ``depends_on``, message ids that must be settled first; ``dedup_id``, which drops the
    message for each queue of its key that got one with the same id within the queue's
    dedup window (when that is every queue, nothing is stored and the existing message's
    id is returned, a second query); ``max_retries`` and
    ``retry_delay`` (seconds between attempts), used instead of the queue's.

    Its expiry (docs/delivery.md, Expiry): ``ttl``, seconds (or a ``timedelta``) from
    publication, or ``expires_at``, an aware ``datetime``, not both. A delivery not posted
    (or read) by then is never posted: it is dead-lettered, its last error saying it
    expired, or dropped if its queue's ``on_expiry`` is ``drop``. A queue's
    ``message_ttl`` applies too; the earlier expiry holds.

    Unique while live (docs/publishing.md): with a ``unique_key``, on each queue of the
    routing key where a delivery with that key is live (not yet acknowledged,
    dead-lettered, cancelled or expired), ``on_duplicate='skip'`` leaves the message out
    and ``'replace'`` deletes the pending delivery for this message's (one in flight is
    left to finish, this message's delivered after it). When every queue skipped, nothing
    is stored and the live one's message id is returned (one more query).

    The body and headers follow :mod:`pgmb.message_limits` (depth, count, size, no reserved
    header names). With OpenTelemetry installed, the current trace context is added to the
    headers (``traceparent``, ``tracestate``; :mod:`pgmb.tracing`) unless they set it.

    Raises :class:`~pgmb.errors.InvalidRoutingKey`, :class:`~pgmb.errors.InvalidBody`,
    :class:`~pgmb.errors.InvalidDelay`, :class:`~pgmb.errors.InvalidOption` before touching
    the database, :class:`~pgmb.errors.DuplicateMessage` if ``message_id`` is taken, and
    :class:`~pgmb.errors.UnknownDependency` if a ``depends_on`` message does not exist.
    """
    validate_routing_key(routing_key)
    mid = _message_id(message_id)
    seconds, at = _delay(delay)
    options = check_options(
        mid,
        priority=priority,
        group=group,
        depends_on=depends_on,
        dedup_id=dedup_id,
        max_retries=max_retries,
        retry_delay=retry_delay,
    )
    ttl_seconds, expiry = check_expiry(ttl, expires_at)
    mode = check_unique_key(unique_key, on_duplicate)
    traced = tracing.with_headers(headers, tracing.publish_headers())
    params = (mid, routing_key, _body(body), _headers(traced), at, seconds)
    params = (*params, *_option_params(options), expiry, ttl_seconds)
    try:
        with connections[using or conf.get().DATABASE].cursor() as cursor:
            if unique_key is not None:
                return _send_unique(cursor, params, unique_key, mode, dedup_id, routing_key)
            cursor.execute(sql.query("publish.sql", "send"), params)
            if cursor.fetchone() is None:
                cursor.execute(sql.query("publish.sql", "deduplicated"), (dedup_id, routing_key))
                return uuid.UUID(str(cursor.fetchone()[0]))
    except IntegrityError as exc:
        raise (_duplicate(exc) or exc) from exc
    return mid


#: How often a send with a unique key is tried again when the live delivery that made it
#: skip was settled before its id could be read (the key is free then).
_UNIQUE_TRIES = 3


def _send_unique(
    cursor: Any,
    params: tuple[Any, ...],
    unique_key: str,
    mode: str | None,
    dedup_id: str | None,
    routing_key: str,
) -> uuid.UUID:
    """``send`` with a unique key: the message's id, or the live one's when it skipped on
    every queue (docs/decisions/0090-unique-while-live.md)."""
    for _ in range(_UNIQUE_TRIES):
        cursor.execute(sql.query("publish.sql", "send_unique"), (*params, unique_key, mode))
        if cursor.fetchone() is not None:
            return uuid.UUID(str(params[0]))
        live = _live_or_duplicated(cursor, unique_key, dedup_id, routing_key)
        if live is not None:
            return live
    raise OperationalError(f"unique key {unique_key!r}: its live delivery kept changing; try again")


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
        unknown = set(item) - _FIELDS
        if unknown or "routing_key" not in item or "body" not in item:
            optional = ", ".join(sorted(_FIELDS - {"routing_key", "body"}))
            raise InvalidBody(
                f"each message needs 'routing_key' and 'body' (optional: {optional}); "
                f"got keys {sorted(item)}"
            )
        return Outgoing(**item)
    if isinstance(item, tuple) and len(item) == 2:
        return Outgoing(item[0], item[1])
    raise InvalidBody(f"cannot publish {type(item).__name__}: use pgmb.Outgoing, a dict or a pair")


def _live_or_duplicated(
    cursor: Any, unique_key: str | None, dedup_id: str | None, routing_key: str
) -> uuid.UUID | None:
    """The message a message was not stored for: the live one of its unique key, else the
    one it duplicates; None when neither is there (settled since the INSERT)."""
    live = None
    if unique_key is not None:
        cursor.execute(sql.query("publish.sql", "unique_live"), (unique_key, routing_key))
        live = cursor.fetchone()[0]
    if live is None and dedup_id is not None:
        cursor.execute(sql.query("publish.sql", "deduplicated"), (dedup_id, routing_key))
        live = cursor.fetchone()[0]
    return None if live is None else uuid.UUID(str(live))


def _stored_instead(
    cursor: Any, unique_key: str | None, dedup_id: str | None, routing_key: str
) -> uuid.UUID:
    """The message a batch's message was not stored for (:func:`_live_or_duplicated`)."""
    live = _live_or_duplicated(cursor, unique_key, dedup_id, routing_key)
    if live is None:  # settled between the INSERT and the look-up
        raise OperationalError(f"unique key {unique_key!r}: its live delivery was settled; retry")
    return live


def send_batch(
    messages: Iterable[Outgoing | Mapping[str, Any] | tuple[str, Any]],
    *,
    using: str | None = None,
) -> list[uuid.UUID]:
    """Publish many messages in one INSERT (one round trip); return their ids in order.

    Items are :class:`Outgoing`, mappings with the same keys, or ``(routing_key, body)``
    pairs. Every item is validated before anything is written: one bad item publishes none.
    A message may depend on one earlier in the same batch. A duplicate (``dedup_id``) gets
    the id of the message it duplicates, and a message skipped on every queue for its
    ``unique_key`` the live one's, looked up in one more query each. Within one batch, the
    first message of a unique key on a queue is delivered there and the later ones skip it
    (they are stored, without a delivery on that queue).
    """
    columns: tuple[list, ...] = tuple([] for _ in range(16))
    context = tracing.publish_headers()  # the batch's, once
    for item in messages:
        out = _outgoing(item)
        validate_routing_key(out.routing_key)
        seconds, at = _delay(out.delay)
        mid = _message_id(out.message_id)
        options = check_options(
            mid,
            priority=out.priority,
            group=out.group,
            depends_on=out.depends_on,
            dedup_id=out.dedup_id,
            max_retries=out.max_retries,
            retry_delay=out.retry_delay,
        )
        ttl_seconds, expiry = check_expiry(out.ttl, out.expires_at)
        mode = check_unique_key(out.unique_key, out.on_duplicate)
        row = (
            mid,
            out.routing_key,
            _body(out.body),
            _headers(tracing.with_headers(out.headers, context)),
            at,
            seconds,
            *_option_params(options),
            ttl_seconds,
            expiry,
            out.unique_key,
            mode,
        )
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    if not columns[0]:
        return []
    ids: list[uuid.UUID] = columns[0]
    # uuid[] of one message each: sent as array texts, see publish.sql.
    deps = columns[8]
    for i, dep in enumerate(deps):
        if dep is not None:
            deps[i] = "{" + ",".join(str(d) for d in dep) + "}"
    try:
        with connections[using or conf.get().DATABASE].cursor() as cursor:
            unique = any(k is not None for k in columns[14])
            if unique:
                cursor.execute(sql.query("publish.sql", "send_batch_unique"), columns)
            else:
                cursor.execute(sql.query("publish.sql", "send_batch"), columns[:14])
            if unique or any(d is not None for d in columns[9]):
                stored = {uuid.UUID(str(row[0])) for row in cursor.fetchall()}
                for i, mid in enumerate(ids):
                    if mid not in stored:
                        ids[i] = _stored_instead(
                            cursor, columns[14][i], columns[9][i], columns[1][i]
                        )
    except IntegrityError as exc:
        raise (_duplicate(exc) or exc) from exc
    return ids
