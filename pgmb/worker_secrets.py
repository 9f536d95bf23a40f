"""A worker's signing secrets: its secret, then the replaced ones that are still retiring.

Rotation (docs/delivery.md, docs/decisions/0038-secret-rotation.md): whoever replaces a
worker's secret (the admin, the ORM, an SQL UPDATE), the worker trigger keeps the old one
in ``pgmb_worker_secret`` (:class:`pgmb.models.WorkerSecret`) until it expires, and every
request is signed with each. Which secrets sign is one rule, ``pgmb.signing_secrets()`` in
SQL: the claim hands its answer to both dispatch paths, and this module asks it for the
admin's test request.

Two bounds (docs/decisions/0058-secret-length-and-retiring-bound.md), each written in
Python and in SQL and run through one table of cases (tests/rules): a new secret holds at
least :data:`MIN_SECRET_BYTES` bytes of key (``pgmb.new_secret_problem``; a shorter one
stored before the rule keeps signing while it stays), and at most
:data:`MAX_RETIRING_SECRETS` retiring secrets sign beside the current one, the most
recently retired (``pgmb.max_retiring_secrets``; replacing a secret retires the oldest
beyond that).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from uuid import UUID

from . import sql
from .db.statements import Call, run
from .db.values import count
from .worker_request import secret_key, secret_problem

if TYPE_CHECKING:
    from .models import Worker


#: The fewest bytes a new secret's key may hold (the base64 after ``whsec_`` decoded, or a
#: raw secret's UTF-8 bytes): 128 bits, what a guesser of an HMAC key must not reach.
MIN_SECRET_BYTES = 16
#: The most retiring secrets that sign a worker's requests beside its current one.
MAX_RETIRING_SECRETS = 5


def new_secret_problem(secret: str) -> str | None:
    """What keeps ``secret`` from being set as a worker's secret now, or None: the secret
    rule (:func:`pgmb.worker_request.secret_problem`), then :data:`MIN_SECRET_BYTES`. The
    sentences are those of ``pgmb.new_secret_problem()`` in SQL; they never quote it."""
    problem = secret_problem(secret)
    if problem is None and secret and len(secret_key(secret)) < MIN_SECRET_BYTES:
        return (
            f"a secret must hold at least {MIN_SECRET_BYTES} bytes (the base64 after "
            "'whsec_' decoded, or the text's UTF-8 bytes)"
        )
    return problem


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
