"""A worker's signing secrets: its secret, then the replaced ones that are still retiring.

Rotation (docs/delivery.md, docs/decisions/0038-secret-rotation.md): whoever replaces a
worker's secret (the admin, the ORM, an SQL UPDATE), the worker trigger keeps the old one
in ``pgmb_worker_secret`` (:class:`pgmb.models.WorkerSecret`) until it expires, and every
request is signed with each. Which secrets sign is one rule, ``pgmb.signing_secrets()`` in
SQL: the claim hands its answer to both dispatch paths, and this module asks it for the
admin's test request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from uuid import UUID

from . import sql
from .db.statements import Call, run
from .db.values import count

if TYPE_CHECKING:
    from .models import Worker


def _read_secrets(names: list[str], rows: list[tuple[Any, ...]]) -> list[str]:
    return list(rows[0][0] or [])


def signing_secrets_call(worker_id: UUID | str, secret: str) -> Call[list[str]]:
    """The secrets that sign the requests of the worker whose secret is ``secret`` now,
    current first (none: unsigned)."""
    return Call(
        sql.query("worker_secrets.sql", "signing_secrets"),
        {"worker_id": str(worker_id), "secret": secret},
        _read_secrets,
    )


def signing_secrets(worker: Worker, using: str | None = None) -> list[str]:
    """:func:`signing_secrets_call` for ``worker`` (saved or not), on a Django connection."""
    return run(signing_secrets_call(worker.pk, worker.secret), using)


def forget_expired_call() -> Call[int]:
    """Removes the retiring secrets that have expired; how many."""
    return Call(sql.query("worker_secrets.sql", "forget_expired"), {}, count)
