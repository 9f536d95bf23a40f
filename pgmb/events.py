"""Operational events: whether pgmb publishes messages of its own (``pgmb.dead_lettered``,
``pgmb.breaker.opened``, ``pgmb.breaker.closed``, ``pgmb.expired``) for a queue bound to
``pgmb.#`` to hear of (docs/operations.md, Events).

Off by default. The switch is one row of the database (``pgmb.event_settings``), read by
the SQL where an event would be published, so turning it on reaches every running
dispatcher at its next statement::

    from pgmb import events
    events.enable()
"""

from __future__ import annotations

from . import sql
from .db.statements import Call, run
from .db.values import scalar

#: The routing keys of pgmb's events; a binding of ``pgmb.#`` gets them all.
DEAD_LETTERED = "pgmb.dead_lettered"
BREAKER_OPENED = "pgmb.breaker.opened"
BREAKER_CLOSED = "pgmb.breaker.closed"
EXPIRED = "pgmb.expired"


def _statement(name: str) -> str:
    return sql.query("events.sql", name)


def enabled(*, using: str | None = None) -> bool:
    """Whether pgmb publishes its events."""
    return bool(run(Call(_statement("enabled"), {}, scalar), using))


def set_enabled(on: bool, *, using: str | None = None) -> bool:
    """Turn events on or off; returns the new state."""
    return bool(run(Call(_statement("set"), {"enabled": on}, scalar), using))


def enable(*, using: str | None = None) -> bool:
    return set_enabled(True, using=using)


def disable(*, using: str | None = None) -> bool:
    return set_enabled(False, using=using)
