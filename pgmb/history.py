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


@dataclass(frozen=True)
class DefaultPartition:
    """A history table's default partition, which premaking reads once under its lock."""

    name: str
    #: The rows it holds by its statistics.
    rows: int
    #: The most rows premaking reads by itself (``pgmb.history_scan_limit()``).
    scan_limit: int


def premake_call(days: int | None = None, scan_limit: int | None = None) -> Call[int]:
    """Makes the day partitions of today and ``days`` days after it (default
    ``PGMB['HISTORY_PREMAKE_DAYS']``) and the far partitions; how many tables it made.
    Nothing while a default partition holds more than ``scan_limit`` rows (default
    ``pgmb.history_scan_limit()``), or while its tables stay busy for a second."""
    if days is None:
        days = conf.get().HISTORY_PREMAKE_DAYS
    if scan_limit is not None and scan_limit < 0:
        raise ValueError(f"scan limit {scan_limit}: must be 0 or more rows")
    return Call(
        sql.query("history.sql", "premake"), {"days": days, "scan_limit": scan_limit}, count
    )


def _defaults(names: list[str], rows: list[tuple[Any, ...]]) -> list[DefaultPartition]:
    return [DefaultPartition(*row) for row in rows]


def defaults_call() -> Call[list[DefaultPartition]]:
    """Each history table's default partition and what premaking may read of it."""
    return Call(sql.query("history.sql", "defaults"), {}, _defaults)


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
