"""Access control for database roles other than the application's (pgmb/sql/schema/access.sql).

Three group roles: ``pgmb_producer`` may publish with ``pgmb.send``, ``pgmb_consumer`` may
consume the queues granted to it, ``pgmb_admin`` may do anything. The functions here run
in the caller's transaction on a Django connection whose role must be allowed to
administer pgmb (the application's own role is). Each raises :class:`~pgmb.errors.AccessDenied`
or :class:`~pgmb.errors.UnknownObject` with the database's message, and then changes nothing.
See docs/access.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connections

from . import sql
from .errors import AccessDenied, UnknownObject

_ERRORS: dict[str, type[Exception]] = {"42501": AccessDenied, "42704": UnknownObject}


@dataclass(frozen=True, slots=True)
class QueueGrant:
    """One role's right to consume one queue."""

    queue: str
    role: str
    granted_at: datetime


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except DatabaseError as exc:
        state = getattr(exc.__cause__, "sqlstate", None)
        if state in _ERRORS:
            raise _ERRORS[state](str(exc.__cause__).strip()) from exc
        raise


def _call(name: str, params: dict[str, Any], using: str) -> Any:
    with _translated(), connections[using].cursor() as cursor:
        cursor.execute(sql.query("access.sql", name), params)
        return cursor.fetchone()[0]


def grant_publish_access(role: str, *, using: str = "default") -> None:
    """Make ``role`` a member of ``pgmb_producer``: it may call ``pgmb.send``."""
    _call("grant_publish_access", {"role": role}, using)


def revoke_publish_access(role: str, *, using: str = "default") -> None:
    """Take ``role`` out of ``pgmb_producer``."""
    _call("revoke_publish_access", {"role": role}, using)


def grant_queue_access(queue: str, role: str, *, using: str = "default") -> bool:
    """Let ``role`` consume ``queue``; returns whether the grant is new."""
    return bool(_call("grant_queue_access", {"queue": queue, "role": role}, using))


def revoke_queue_access(queue: str, role: str, *, using: str = "default") -> bool:
    """Take back ``role``'s right to consume ``queue``; returns whether it had it."""
    return bool(_call("revoke_queue_access", {"queue": queue, "role": role}, using))


def schema_writers(*, using: str = "default") -> list[tuple[str, str]]:
    """(schema, role) for each role besides pgmb's owner and superusers that may create in the
    tables' schema or in ``pgmb``: while there is one, pgmb's definers refuse to run
    (``pgmb.refuse_writable_schemas``, docs/security.md). ``PUBLIC`` stands for every role.
    """
    with _translated(), connections[using].cursor() as cursor:
        cursor.execute(sql.query("access.sql", "schema_writers"))
        return [(schema, role) for schema, role in cursor.fetchall()]


def public_extension_functions(extension: str, *, using: str = "default") -> list[str]:
    """The functions of ``extension`` that PUBLIC may execute (signatures), empty when it is
    not installed: for ``http``, every role could post from the database server."""
    with _translated(), connections[using].cursor() as cursor:
        cursor.execute(
            sql.query("access.sql", "public_extension_functions"), {"extension": extension}
        )
        return [row[0] for row in cursor.fetchall()]


def reviewed_public_routines() -> list[str]:
    """The signatures that ``pgmb/sql/schema/`` grants to PUBLIC (access.sql's list): the
    reviewed list (docs/security.md), read from the statements that grant them."""
    source = _SQL_COMMENT.sub("", sql.schema_source())
    return [
        signature
        for grant in _PUBLIC_GRANT.findall(source)
        for signature in _SIGNATURE.findall(grant)
    ]


_SQL_COMMENT = re.compile(r"--[^\n]*")
_PUBLIC_GRANT = re.compile(
    r"GRANT EXECUTE ON (?:FUNCTION|ROUTINE|PROCEDURE)([^;]*?)TO PUBLIC;", re.IGNORECASE
)
_SIGNATURE = re.compile(r"pgmb\.\w+\([^)]*\)")


def unreviewed_public_routines(*, using: str = "default") -> list[str]:
    """The routines of schema ``pgmb`` that PUBLIC may execute beyond the reviewed list:
    one created after migrating by a role whose defaults give PUBLIC ``EXECUTE`` (a
    superuser's, docs/decisions/0060-an-owner-that-is-not-a-superuser.md), or granted."""
    with _translated(), connections[using].cursor() as cursor:
        cursor.execute(
            sql.query("access.sql", "unreviewed_public_routines"),
            {"reviewed": reviewed_public_routines()},
        )
        return [row[0] for row in cursor.fetchall()]


def queue_grants(*, using: str = "default") -> list[QueueGrant]:
    """Every queue grant, by queue then role."""
    with _translated(), connections[using].cursor() as cursor:
        cursor.execute(sql.query("access.sql", "queue_grants"))
        return [QueueGrant(*row) for row in cursor.fetchall()]
