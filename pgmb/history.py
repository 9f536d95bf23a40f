"""The history's days: ``pgmb_message`` and ``pgmb_attempt`` are partitioned by the UTC day
of the message id (docs/decisions/0076-history-partitioned-by-message-day.md).

:func:`premake_call` makes the days ahead (``PGMB['HISTORY_PREMAKE_DAYS']``): the
dispatcher's housekeeping does it (:mod:`pgmb.housekeeping`), ``pgmb.maintenance()`` on the
pg_cron path, and ``manage.py pgmb_history premake``. A publish never waits for it: an id
with no day of its own goes to the default partition.

:func:`retire_call` is retention, only when asked (``manage.py pgmb_history retire``, or
``SELECT pgmb.retire_history(...)`` from pg_cron): each day older than the age is dropped,
both its tables, unless it holds unfinished messages (a live delivery or a dead letter),
which it keeps, alone, until a later run finds them finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any

from . import conf, sql
from .archive_age import days_problem
from .db.statements import Call
from .db.values import count

SECONDS_A_DAY = 86_400


@dataclass(frozen=True)
class RetiredDay:
    """One day retired by :func:`retire_call`."""

    day: date
    #: Messages and attempts removed with it (None: not counted).
    messages: int | None
    attempts: int | None
    #: Unfinished messages it keeps (0: the day's tables were dropped).
    kept: int

    def describe(self) -> str:
        done = "dropped" if not self.kept else f"kept {self.kept:,} unfinished message(s)"
        if self.messages is None or self.attempts is None:
            return f"{self.day.isoformat()}: {done}"
        return (
            f"{self.day.isoformat()}: {self.messages:,} messages and {self.attempts:,} "
            f"attempts removed, {done}"
        )


def premake_call(days: int | None = None) -> Call[int]:
    """Makes the day partitions of today and ``days`` days after it (default
    ``PGMB['HISTORY_PREMAKE_DAYS']``); how many tables it made."""
    if days is None:
        days = conf.get().HISTORY_PREMAKE_DAYS
    return Call(sql.query("history.sql", "premake"), {"days": days}, count)


def _retired(names: list[str], rows: list[tuple[Any, ...]]) -> list[RetiredDay]:
    return [RetiredDay(*row) for row in rows]


def retire_call(older_than_days: float, *, count: bool = True) -> Call[list[RetiredDay]]:
    """Retires the days that ended more than ``older_than_days`` ago, counting what each
    removes if ``count`` (which reads the day's tables: a second or so a million rows)."""
    problem = days_problem(older_than_days)
    if problem:
        raise ValueError(f"retention age {problem}")
    return Call(
        sql.query("history.sql", "retire"),
        {"seconds": float(older_than_days) * SECONDS_A_DAY, "count": count},
        _retired,
    )
