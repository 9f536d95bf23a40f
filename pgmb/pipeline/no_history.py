"""The queues that keep no history (``keep_history`` off): a deleted message of theirs left
no attempt, so the archive has none to keep and the statistics none to count. Both jobs
name them in their reports (docs/decisions/0063-pull-queues-without-history.md)."""

from __future__ import annotations

from typing import Any

from .. import sql

#: What each job cannot do for those queues' deleted messages.
CONSEQUENCE = {
    "archive": "their deleted messages are archived without an attempt: none was recorded",
    "stats": "their deleted messages are not counted as delivered: no attempt was recorded",
}


def queues(conn: Any) -> list[str]:
    """The names of the queues without history, on a psycopg connection."""
    return [name for (name,) in conn.execute(sql.query("statistics.sql", "without_history"))]


def note(job: str, names: list[str]) -> str | None:
    """The report's line for ``job`` ("archive" or "stats"); None while every queue keeps
    its history."""
    if not names:
        return None
    return f"{job}: queues that keep no history: {', '.join(names)} ({CONSEQUENCE[job]})"
