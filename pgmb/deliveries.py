"""The typed API over the delivery state machine: claim, start, ack, fail, release,
reclaim, requeue, purge, replay.

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


def next_wakeup(queues: Iterable[str] | None = None, *, using: str | None = None) -> float | None:
    """Seconds until something of ``queues`` may be claimable; None when nothing is pending."""
    return run(next_wakeup_call(queues), using)


def busy(queues: Iterable[str] | None = None, *, using: str | None = None) -> bool:
    """Whether anything of ``queues`` is due, leased or waiting for a retry."""
    return run(busy_call(queues), using)
