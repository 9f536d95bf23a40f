"""Hourly delivery statistics, as the Spark pipeline's ``stats`` job left them in
``pgmb_statistics`` (:class:`pgmb.models.HourlyStatistics`), for charts of long ranges::

    from pgmb import hourly_stats
    totals = hourly_stats.hourly(since, until)                     # every queue, per hour
    alpha = hourly_stats.hourly(since, until, worker="alpha")      # one worker's queues
    orders = hourly_stats.hourly(since, until, queue="orders")     # one queue
    hourly_stats.latest()                                          # the newest hour there is

Hours are UTC and whole; a row covers ``[hour, hour + 1 h)``. The figures are as fresh as
the job's last run (``manage.py pgmb_pipeline stats``, see docs/pipeline.md): the live
figures of the last hour are :mod:`pgmb.metrics`'. One statement per call, from
``pgmb/sql/queries/statistics.sql``, on the caller's connection and transaction.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from . import sql
from .db.statements import Call, run
from .db.values import jsonb, scalar


@dataclass(frozen=True, slots=True)
class ErrorCount:
    """How many failed attempts of an hour had one status."""

    #: The HTTP status; None: no answer (connection error, timeout, lease expired).
    status: int | None
    count: int


@dataclass(frozen=True, slots=True)
class HourRow:
    """One hour of one queue, one worker (``queue_name`` empty: all its queues) or all
    queues (both names empty)."""

    #: The hour's start (UTC).
    hour: datetime.datetime
    queue_name: str
    worker_name: str
    attempts: int
    #: Acknowledged attempts.
    delivered: int
    #: Attempts not acknowledged: retried, dead-lettered or expired ('unsent' leases, which
    #: asked no worker anything, are not attempts here).
    failed: int
    retried: int
    dead_lettered: int
    #: Leases that ran out before an outcome was recorded.
    expired: int
    #: The average attempt number of the acks (1.0: no retries); None without acks.
    attempts_per_message: float | None
    #: From publishing to the ack, over the acks of the hour; None without acks.
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    #: The most frequent statuses of the failed attempts (at most three), most frequent first.
    top_errors: tuple[ErrorCount, ...]


def _statement(name: str) -> str:
    return sql.query("statistics.sql", name)


def _errors(value: Any) -> tuple[ErrorCount, ...]:
    items = jsonb(value)
    return tuple(ErrorCount(status=e.get("status"), count=int(e["count"])) for e in items or ())


def _rows(names: list[str], rows: list[tuple[Any, ...]]) -> list[HourRow]:
    result = []
    for row in rows:
        fields = dict(zip(names, row, strict=True))
        fields["top_errors"] = _errors(fields["top_errors"])
        result.append(HourRow(**fields))
    return result


def hourly_call(
    since: datetime.datetime,
    until: datetime.datetime,
    queue: str | None = None,
    worker: str | None = None,
) -> Call[list[HourRow]]:
    return Call(
        _statement("hourly"),
        {"since": since, "until": until, "queue": queue, "worker": worker},
        _rows,
    )


def hourly(
    since: datetime.datetime,
    until: datetime.datetime,
    queue: str | None = None,
    worker: str | None = None,
    *,
    using: str | None = None,
) -> list[HourRow]:
    """The hours that overlap ``[since, until)``, oldest first; hours without attempts
    have no row.

    Without ``queue`` or ``worker``: each hour's totals over every queue. With ``worker``
    alone: that worker's totals over its queues. With ``queue``: that queue's rows (one per
    hour, or one per worker in an hour its worker changed; ``worker`` narrows them).
    """
    return run(hourly_call(since, until, queue, worker), using)


def latest(*, using: str | None = None) -> datetime.datetime | None:
    """The newest hour the statistics cover; None before the job's first run."""
    found: datetime.datetime | None = run(Call(_statement("latest"), {}, scalar), using)
    return found
