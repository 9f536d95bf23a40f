"""What went wrong, in one line: for logs, command errors and recorded outcomes.

An exception's text may run over many lines (a server's DETAIL and HINT, a JVM's stack
trace); its first line says what happened. Imports nothing (the Spark pipeline's jobs
use it too).
"""

from __future__ import annotations

from typing import Any


def first_line(exc: BaseException, text: str | None = None, *, typed: bool = False) -> str:
    """The first line of ``exc``'s text (or of ``text``, when the useful text is elsewhere,
    such as a Java exception's), or the exception's class name when there is none.

    ``typed`` puts the class name in front (``OSError: …``), for errors of any kind.
    """
    stripped = (str(exc) if text is None else text).strip()
    if not stripped:
        return type(exc).__name__
    line = stripped.splitlines()[0]
    return f"{type(exc).__name__}: {line}" if typed else line


def one_line(text: str) -> str:
    """``text`` on a single line: Django prints a CommandError as one line of stderr."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def database_reason(exc: BaseException) -> str:
    """The database's own words for why it refused a statement (message and detail), from
    Django's ``DatabaseError`` (psycopg's error is its cause)."""
    diag: Any = getattr(exc.__cause__, "diag", None)
    if diag is not None and diag.message_primary:
        detail = f" ({diag.message_detail})" if diag.message_detail else ""
        return one_line(f"{diag.message_primary}{detail}")
    return one_line(str(exc))
