"""Fair shares per key (docs/fairness.md): a queue's fairness header, whose values its
claims take in turn, and each key's weight, cap on requests in flight and rate limit. The
rules and the turns are SQL's (pgmb/sql/schema/fairness.sql); these are its calls::

    from pgmb import fairness
    fairness.set_header("orders", "tenant")
    fairness.set_key("orders", "acme", weight=2)
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from . import sql
from .db.statements import Call, run
from .db.values import scalar


@dataclass(frozen=True)
class Key:
    """A key of a fair queue as stored: its settings and when it was last served."""

    key: str
    weight: int
    max_in_flight: int | None
    rps: float | None
    served_at: datetime | None


@dataclass(frozen=True)
class Shares:
    """A queue's fairness header (None: off) and its keys, the next served first."""

    header: str | None
    keys: list[Key]


def _statement(name: str) -> str:
    return sql.query("fairness.sql", name)


def set_header(queue: str, header: str | None, *, using: str | None = None) -> uuid.UUID:
    """Name the queue's fairness header (None: off, oldest first again); its live
    deliveries take their keys at once. Bad input raises the database's error (SQLSTATE
    22023), nothing changed. Returns the queue's id."""
    call = Call(_statement("header"), {"queue": queue, "header": header}, scalar)
    return uuid.UUID(str(run(call, using)))


def set_key(
    queue: str,
    key: str,
    *,
    weight: int = 1,
    max_in_flight: int | None = None,
    rps: float | None = None,
    using: str | None = None,
) -> None:
    """Set one key's settings, all of them (a None lifts a cap or a rate limit)."""
    params = {
        "queue": queue,
        "key": key,
        "weight": weight,
        "max_in_flight": max_in_flight,
        "rps": rps,
    }
    run(Call(_statement("key"), params, scalar), using)


def _shares(names: list[str], rows: list[tuple[Any, ...]]) -> Shares | None:
    if not rows:
        return None
    keys = [Key(*row[1:]) for row in rows if row[1] is not None]
    return Shares(rows[0][0], keys)


def shares(queue: str, *, using: str | None = None) -> Shares | None:
    """The queue's header and keys (None: no such queue)."""
    return run(Call(_statement("keys"), {"queue": queue}, _shares), using)
