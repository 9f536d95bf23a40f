"""The circuit breaker of a worker: closing it by hand, and hearing of its transitions.

A worker with ``breaker_failures`` or ``breaker_rate`` set is paused by the database when
its endpoint keeps failing, and probed before it resumes (pgmb/sql/schema/breakers.sql: the
transitions are made by ``pgmb.breaker_settle``, ``pgmb.breaker_admit`` and
``pgmb.breaker_reset``, in SQL, for both dispatchers). Each transition raises one WARNING
with SQLSTATE :data:`NOTICE_SQLSTATE` whose DETAIL is a JSON object (worker, state, reason):
the server log keeps it, and a psycopg connection hands it to :func:`log_notice` when that
is its notice handler (the external dispatcher's connections)::

    from pgmb import breakers
    breakers.reset([worker.pk])           # close by hand; returns how many were not closed
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable
from typing import Any

from . import sql
from .db.statements import Call, run
from .db.values import count

log = logging.getLogger("pgmb.dispatch")

#: The SQLSTATE of the warning each transition raises (class 01: warning).
NOTICE_SQLSTATE = "01PB0"

#: What each state means, for people (the admin, the log).
STATES = {"closed": "closed", "open": "open", "half_open": "half-open"}


def reset_call(worker_ids: Iterable[uuid.UUID | str]) -> Call[int]:
    ids = [i if isinstance(i, uuid.UUID) else uuid.UUID(str(i)) for i in worker_ids]
    return Call(sql.query("breakers.sql", "reset"), {"ids": ids}, count)


def reset(worker_ids: Iterable[uuid.UUID | str], *, using: str | None = None) -> int:
    """Close the breakers of these workers by hand: their deliveries are claimable at once.

    Returns how many were open or half-open; closed ones are left as they are.
    """
    return run(reset_call(worker_ids), using)


def transition(diag: Any) -> tuple[str, str, str] | None:
    """(worker, state, reason) of a breaker's notice, None for any other notice."""
    if getattr(diag, "sqlstate", None) != NOTICE_SQLSTATE:
        return None
    try:
        detail = json.loads(diag.message_detail or "")
        return str(detail["worker"]), str(detail["state"]), str(detail["reason"])
    except (ValueError, KeyError, TypeError):
        return None


def log_notice(diag: Any) -> None:
    """A psycopg notice handler: log a breaker's transition, one line (WARNING when it
    opens, INFO otherwise); other notices are left alone."""
    moved = transition(diag)
    if moved is None:
        return
    worker, state, reason = moved
    log.log(
        logging.WARNING if state == "open" else logging.INFO,
        "circuit breaker worker=%s state=%s reason=%r",
        worker,
        STATES.get(state, state),
        reason,
    )
