"""What PostgreSQL returns, as Python values, and text as PostgreSQL can store it.

The readers (:func:`scalar`, :func:`count`) take a statement's (column names, rows), as
:class:`pgmb.db.statements.Call` hands them over.
"""

from __future__ import annotations

import json
from typing import Any


def scalar(names: list[str], rows: list[tuple[Any, ...]]) -> Any:
    """The first column of the first row; None when there is no row."""
    return rows[0][0] if rows else None


def count(names: list[str], rows: list[tuple[Any, ...]]) -> int:
    """A statement's single number (a row count); 0 for NULL or no row."""
    return int(scalar(names, rows) or 0)


def jsonb(value: Any) -> Any:
    """A jsonb value, decoded."""
    # Django's PostgreSQL backend hands jsonb over as text (its JSONField decodes it); a
    # plain psycopg connection, already decoded.
    return json.loads(value) if isinstance(value, str | bytes) else value


def storable(text: str) -> str:
    """``text`` as PostgreSQL can store it: an error may quote a worker's answer or an
    exception, with NUL characters or lone surrogates in it."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
