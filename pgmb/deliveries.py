"""The typed API over the delivery state machine: claim, start, ack, fail, release,
reclaim, requeue, purge, replay, backfill, recover, cancel, run now.

Every transition is one SQL function of schema ``pgmb`` (the single implementation both
dispatchers share), called here once, with named parameters, from
``pgmb/sql/queries/deliveries.sql``. The functions run on a Django connection, inside the
caller's transaction::

    from pgmb import deliveries
    deliveries.requeue_queue("order_queue")
    for claim in deliveries.claim(["order_queue"], limit=10): ...

The ``*_call`` functions build the statements themselves (:class:`pgmb.db.statements.Call`),
for callers that run them their own way, such as the external dispatcher on its
reconnecting connections (:class:`pgmb.db.reconnecting.Database`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from . import sql
from .db.statements import Call, run
from .db.values import count, scalar, storable


@dataclass(frozen=True, slots=True)
class Claimed:
    """One leased delivery, with everything needed to POST it."""

    delivery_id: int
    #: Fences this claim's outcome: a dispatcher whose lease ran out cannot fail or
    #: release a delivery someone else has claimed since.
    lease_id: uuid.UUID
    #: This attempt's number, from 1.
    attempt: int
    #: 1 + the queue's max_retries: a failure of this attempt dead-letters the delivery.
    max_attempts: int
    queue: str
    message_id: str
    routing_key: str
    #: The message body as JSON text, posted as it is.
    body: str
    headers: dict[str, Any] | None
    worker_id: str
    endpoint: str
    #: The worker's HTTP timeout, in seconds.
    timeout: float
    #: The secrets that sign the request (``pgmb.signing_secrets()``), the worker's current
    #: one first; more than one while a replaced secret retires; empty: unsigned.
    secrets: list[str]
    rps: int
    #: How long the lease lasts, in seconds, counted from the claim.
    lease_seconds: float

    @property
    def last_attempt(self) -> bool:
        """Whether a failure of this attempt moves the delivery to the dead letters."""
        return self.attempt >= self.max_attempts


@dataclass(frozen=True, slots=True)
class Success:
    """A 2xx answer to a claimed delivery."""

    delivery_id: int
    status: int | None = None
    duration_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt: no answer (status None) or a non-2xx one."""

    delivery_id: int
    lease_id: uuid.UUID
    status: int | None = None
    error: str = ""
    #: Seconds the worker asked to wait (Retry-After); the backoff is at least this long.
    retry_after: float | None = None
    duration_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Recorded:
    """What one :func:`record` wrote: start marks, acks and failures."""

    started: int
    acked: int
    failed: int


@dataclass(frozen=True, slots=True)
class Canceled:
    """What one :func:`cancel` did."""

    #: Ready, delayed, retrying or waiting deliveries deleted, each recorded 'canceled'.
    removed: int
    #: Leased deliveries marked: their request's outcome, when it comes, is recorded
    #: 'canceled' and deletes them, never retried nor dead-lettered.
    in_flight: int

    @property
    def total(self) -> int:
        return self.removed + self.in_flight


@dataclass(frozen=True, slots=True)
class MadeDue:
    """What one :func:`run_now` did."""

    #: Ready deliveries (delayed or waiting for a retry) now due.
    due: int
    #: Waiting deliveries now due, but still behind their group's earlier member or their
    #: dependencies until those settle.
    waiting: int

    @property
    def total(self) -> int:
        return self.due + self.waiting


def _statement(name: str) -> str:
    return sql.query("deliveries.sql", name)


_CLAIMED_FIELDS = [f.name for f in fields(Claimed)]


def _claims(names: list[str], rows: list[tuple[Any, ...]]) -> list[Claimed]:
    # By position, a row costs the dispatcher 2 µs less than by name (its decoding is on
    # the hot path): deliveries.sql's claim selects Claimed's fields in their order.
    if names != _CLAIMED_FIELDS:
        raise RuntimeError(f"the claim's columns {names} are not Claimed's fields in order")
    return [Claimed(*row) for row in rows]


def _queues(queues: Iterable[str] | None) -> list[str] | None:
    return None if queues is None else list(queues)


def _ids(ids: int | Iterable[int]) -> list[int]:
    return [ids] if isinstance(ids, int) else [int(i) for i in ids]


def claim_call(queues: Iterable[str] | None = None, limit: int = 100) -> Call[list[Claimed]]:
    return Call(_statement("claim"), {"queues": _queues(queues), "limit": limit}, _claims)


def start_call(claims: Sequence[Claimed]) -> Call[int]:
    return Call(_statement("start"), _start_params(claims, ""), count)


def _start_params(claims: Sequence[Claimed], prefix: str) -> dict[str, Any]:
    return {
        f"{prefix}ids": [c.delivery_id for c in claims],
        f"{prefix}lease_ids": [c.lease_id for c in claims],
    }


def ack_call(successes: Sequence[Success]) -> Call[int]:
    return Call(_statement("ack"), _ack_params(successes, ""), count)


def _ack_params(successes: Sequence[Success], prefix: str) -> dict[str, Any]:
    return {
        f"{prefix}ids": [s.delivery_id for s in successes],
        f"{prefix}statuses": [s.status for s in successes],
        f"{prefix}durations_ms": [s.duration_ms for s in successes],
    }


def fail_call(failures: Sequence[Failure]) -> Call[int]:
    return Call(_statement("fail"), _fail_params(failures, ""), count)


def _fail_params(failures: Sequence[Failure], prefix: str) -> dict[str, Any]:
    return {
        f"{prefix}ids": [f.delivery_id for f in failures],
        f"{prefix}lease_ids": [f.lease_id for f in failures],
        f"{prefix}statuses": [f.status for f in failures],
        f"{prefix}errors": [storable(f.error) for f in failures],
        f"{prefix}retry_after": [f.retry_after for f in failures],
        f"{prefix}durations_ms": [f.duration_ms for f in failures],
    }


def _recorded(names: list[str], rows: list[tuple[Any, ...]]) -> Recorded:
    return Recorded(**dict(zip(names, rows[0], strict=True)))


def record_call(
    started: Sequence[Claimed], successes: Sequence[Success], failures: Sequence[Failure]
) -> Call[Recorded]:
    return Call(
        _statement("record"),
        {
            **_start_params(started, "start_"),
            **_ack_params(successes, "ack_"),
            **_fail_params(failures, "fail_"),
        },
        _recorded,
    )


def release_call(claims: Sequence[Claimed]) -> Call[int]:
    return Call(
        _statement("release"),
        {"ids": [c.delivery_id for c in claims], "lease_ids": [c.lease_id for c in claims]},
        count,
    )


def reclaim_expired_call(limit: int = 1000) -> Call[int]:
    return Call(_statement("reclaim_expired"), {"limit": limit}, count)


def expire_call(limit: int = 1000) -> Call[int]:
    return Call(_statement("expire"), {"limit": limit}, count)


def fire_schedules_call(limit: int = 100) -> Call[tuple[int, float | None]]:
    """Fire the schedules due (``pgmb.fire_due_schedules``): how many messages were
    published, and the seconds until the next due schedule (None: none)."""
    return Call(
        _statement("fire_schedules"), {"limit": limit}, lambda n, r: (int(r[0][0]), r[0][1])
    )


def requeue_call(dead_letter_ids: int | Iterable[int]) -> Call[int]:
    return Call(_statement("requeue"), {"ids": _ids(dead_letter_ids)}, count)


def requeue_queue_call(queue: str) -> Call[int]:
    return Call(_statement("requeue_queue"), {"queue": queue}, count)


def purge_dead_letters_call(dead_letter_ids: int | Iterable[int]) -> Call[int]:
    return Call(_statement("purge_dead_letters"), {"ids": _ids(dead_letter_ids)}, count)


def purge_queue_dead_letters_call(queue: str) -> Call[int]:
    return Call(_statement("purge_queue_dead_letters"), {"queue": queue}, count)


def _message_ids(ids: uuid.UUID | str | Iterable[uuid.UUID | str]) -> list[uuid.UUID]:
    if isinstance(ids, uuid.UUID | str):
        ids = [ids]
    return [i if isinstance(i, uuid.UUID) else uuid.UUID(str(i)) for i in ids]


def replay_call(
    message_ids: uuid.UUID | str | Iterable[uuid.UUID | str], queues: Iterable[str] | None = None
) -> Call[int]:
    return Call(
        _statement("replay"), {"ids": _message_ids(message_ids), "queues": _queues(queues)}, count
    )


def _canceled(names: list[str], rows: list[tuple[Any, ...]]) -> Canceled:
    return Canceled(**dict(zip(names, rows[0], strict=True)))


def _made_due(names: list[str], rows: list[tuple[Any, ...]]) -> MadeDue:
    return MadeDue(**dict(zip(names, rows[0], strict=True)))


def _filters(
    queue: str, routing_key_prefix: str | None, older_than: timedelta | None
) -> dict[str, Any]:
    return {"queue": queue, "prefix": routing_key_prefix, "older_than": older_than}


def cancel_call(delivery_ids: int | Iterable[int]) -> Call[Canceled]:
    return Call(_statement("cancel"), {"ids": _ids(delivery_ids)}, _canceled)


def cancel_matching_call(
    queue: str, routing_key_prefix: str | None = None, older_than: timedelta | None = None
) -> Call[Canceled]:
    return Call(
        _statement("cancel_matching"), _filters(queue, routing_key_prefix, older_than), _canceled
    )


def run_now_call(delivery_ids: int | Iterable[int]) -> Call[MadeDue]:
    return Call(_statement("run_now"), {"ids": _ids(delivery_ids)}, _made_due)


def run_now_matching_call(
    queue: str, routing_key_prefix: str | None = None, older_than: timedelta | None = None
) -> Call[MadeDue]:
    return Call(
        _statement("run_now_matching"), _filters(queue, routing_key_prefix, older_than), _made_due
    )


#: How many deliveries one :func:`backfill` or :func:`recover` call makes at most, unless
#: told otherwise (``pgmb.backfill``'s and ``pgmb.recover``'s default; at most 1,000,000).
WINDOW_LIMIT = 10_000


def backfill_call(
    queue: str, since: datetime, until: datetime, limit: int = WINDOW_LIMIT
) -> Call[int]:
    return Call(
        _statement("backfill"),
        {"queue": queue, "since": since, "until": until, "limit": limit},
        count,
    )


def recover_call(
    queue: str, since: datetime, until: datetime | None = None, limit: int = WINDOW_LIMIT
) -> Call[int]:
    return Call(
        _statement("recover"),
        {"queue": queue, "since": since, "until": until, "limit": limit},
        count,
    )


def next_wakeup_call(queues: Iterable[str] | None = None) -> Call[float | None]:
    return Call(_statement("next_wakeup"), {"queues": _queues(queues)}, scalar)


def busy_call(queues: Iterable[str] | None = None) -> Call[bool]:
    return Call(_statement("busy"), {"queues": _queues(queues)}, lambda n, r: bool(scalar(n, r)))


def claim(
    queues: Iterable[str] | None = None, limit: int = 100, *, using: str | None = None
) -> list[Claimed]:
    """Lease up to ``limit`` due deliveries of ``queues`` (None: all), within rate limits."""
    return run(claim_call(queues, limit), using)


def start(claims: Sequence[Claimed], *, using: str | None = None) -> int:
    """Mark claimed deliveries started: their requests are on their way.

    A lease that expires after this counts as a failed attempt; one that expires unmarked
    hands its attempt back (up to twice per delivery, then it counts too). Fenced by lease:
    a mark of a lease that has ended, or a second mark, changes nothing. Returns how many
    were marked.
    """
    return run(start_call(claims), using) if claims else 0


def record(
    started: Sequence[Claimed],
    successes: Sequence[Success],
    failures: Sequence[Failure],
    *,
    using: str | None = None,
) -> Recorded:
    """:func:`start`, :func:`ack` and :func:`fail` in one statement (one commit)."""
    return run(record_call(started, successes, failures), using)


def ack(successes: Sequence[Success], *, using: str | None = None) -> int:
    """Record 2xx answers: the deliveries leave the hot table; returns how many were acked."""
    return run(ack_call(successes), using) if successes else 0


def fail(failures: Sequence[Failure], *, using: str | None = None) -> int:
    """Record failed attempts: retry after a backoff, or dead-letter the last attempt.

    Fenced by lease: a failure whose lease is no longer the delivery's is ignored.
    Returns how many were recorded.
    """
    return run(fail_call(failures), using) if failures else 0


def release(claims: Sequence[Claimed], *, using: str | None = None) -> int:
    """Hand claimed deliveries back unattempted (due at once, the attempt not counted)."""
    return run(release_call(claims), using) if claims else 0


def reclaim_expired(limit: int = 1000, *, using: str | None = None) -> int:
    """Settle leases that ran out (a dispatcher died or hung); returns how many.

    A lease whose request was marked started (:func:`start`) counts as a failed attempt
    (outcome ``expired``, dead-lettered at the limit); one never marked hands its attempt
    back, due at once (outcome ``unsent``), except from a delivery's third such expiry on.
    """
    return run(reclaim_expired_call(limit), using)


def expire(limit: int = 1000, *, using: str | None = None) -> int:
    """Settle deliveries whose time to live ran out before they were posted or read (a
    message's ``ttl`` or ``expires_at``, its queue's ``message_ttl``); returns how many.

    Each is dead-lettered, its last error saying it expired, or dropped if its queue's
    ``on_expiry`` is ``drop``; either way the history gets a row with outcome ``ttl``. A
    leased delivery is left to its outcome. Both dispatchers call this as they reclaim
    expired leases; claims and reads never hand out an expired delivery meanwhile.
    """
    return run(expire_call(limit), using)


def requeue(dead_letter_ids: int | Iterable[int], *, using: str | None = None) -> int:
    """Move dead letters (one id or many) back to their queues, due now, attempts from 0."""
    return run(requeue_call(dead_letter_ids), using)


def requeue_queue(queue: str, *, using: str | None = None) -> int:
    """Move every dead letter of ``queue`` back to it; returns how many."""
    return run(requeue_queue_call(queue), using)


def purge_dead_letters(dead_letter_ids: int | Iterable[int], *, using: str | None = None) -> int:
    """Delete dead letters (their attempt history stays); returns how many."""
    return run(purge_dead_letters_call(dead_letter_ids), using)


def purge_queue_dead_letters(queue: str, *, using: str | None = None) -> int:
    """Delete every dead letter of ``queue``; returns how many."""
    return run(purge_queue_dead_letters_call(queue), using)


def replay(
    message_ids: uuid.UUID | str | Iterable[uuid.UUID | str],
    queues: Iterable[str] | None = None,
    *,
    using: str | None = None,
) -> int:
    """Deliver messages (one id or many) again to the queues that acknowledged them.

    One new delivery per (message, queue that acked it), due now, attempts from 0; only
    ``queues`` when given. A queue where the message is live or dead right now is skipped.
    Returns how many deliveries were created.
    """
    return run(replay_call(message_ids, queues), using)


def cancel(delivery_ids: int | Iterable[int], *, using: str | None = None) -> Canceled:
    """Cancel live deliveries (one id or many); never posted again.

    A ready, delayed, retrying or waiting one is deleted now, recorded as 'canceled' in the
    history, and releases the deliveries waiting behind it as any removal does. A leased
    one is marked: its request is in flight, and its outcome is recorded as 'canceled' and
    deletes it. Ids that are unknown, finished or already cancelled change nothing: count
    the result (docs/decisions/0084-cancel-and-run-now.md).
    """
    return run(cancel_call(delivery_ids), using)


def cancel_matching(
    queue: str,
    routing_key_prefix: str | None = None,
    older_than: timedelta | None = None,
    *,
    using: str | None = None,
) -> Canceled:
    """:func:`cancel` every live delivery of ``queue`` whose routing key begins with
    ``routing_key_prefix`` and that was created at least ``older_than`` ago (None: any).

    An unknown queue raises the database's error (``no queue named ...``)."""
    return run(cancel_matching_call(queue, routing_key_prefix, older_than), using)


def run_now(delivery_ids: int | Iterable[int], *, using: str | None = None) -> MadeDue:
    """Make live deliveries (one id or many) due now.

    A ready one (delayed, or waiting out a retry's backoff) may be claimed at once, within
    its worker's rate limit and circuit breaker, if its queue is not paused; a waiting one
    is due now but stays behind its group or dependencies. One already due, leased or
    unknown changes nothing.
    """
    return run(run_now_call(delivery_ids), using)


def run_now_matching(
    queue: str,
    routing_key_prefix: str | None = None,
    older_than: timedelta | None = None,
    *,
    using: str | None = None,
) -> MadeDue:
    """:func:`run_now` for the live deliveries of ``queue`` that match, as
    :func:`cancel_matching`'s filters."""
    return run(run_now_matching_call(queue, routing_key_prefix, older_than), using)


def backfill(
    queue: str,
    since: datetime,
    until: datetime,
    limit: int = WINDOW_LIMIT,
    *,
    using: str | None = None,
) -> int:
    """Give ``queue`` the stored messages published from ``since`` to before ``until`` (and
    before the queue was made) that its binding matches, oldest first, at most ``limit``.

    A message the queue has or had (a delivery, a dead letter, an attempt) is skipped: a
    second call adds nothing, or the next ``limit`` when more matched. Refused (an unknown
    queue, a window without both ends or ending before it starts, a queue that keeps no
    history) with a database error, nothing changed. Returns how many deliveries it made.
    """
    return run(backfill_call(queue, since, until, limit), using)


def recover(
    queue: str,
    since: datetime,
    until: datetime | None = None,
    limit: int = WINDOW_LIMIT,
    *,
    using: str | None = None,
) -> int:
    """Requeue the dead letters of ``queue`` that died from ``since`` to before ``until``
    (None: now), oldest first, at most ``limit``; returns how many. Refused as
    :func:`backfill`, nothing changed."""
    return run(recover_call(queue, since, until, limit), using)


def next_wakeup(queues: Iterable[str] | None = None, *, using: str | None = None) -> float | None:
    """Seconds until something of ``queues`` may be claimable; None when nothing is pending."""
    return run(next_wakeup_call(queues), using)


def busy(queues: Iterable[str] | None = None, *, using: str | None = None) -> bool:
    """Whether anything of ``queues`` is due, leased or waiting for a retry."""
    return run(busy_call(queues), using)
