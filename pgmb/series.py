"""The dashboard's time series: what happened, minute by minute, to a queue, a worker or all.

::

    from pgmb import series
    points = series.series(series.LIVE, queue="order_queue")   # 61 Points, oldest first

One :class:`Point` per minute holds the attempts that ended in it (delivered, failed,
dead-lettered), the latency of its requests (p50, p95 of ``duration_ms``), the queue depth
at its end and the messages published in it that no queue took. The live range, the last
hour, is read from pgmb's own tables in one statement (``pgmb/sql/queries/dashboard.sql``,
``live_minutes``), with the same "last hour" as :mod:`pgmb.metrics`: each count's sum is
the figure of the queue and worker lists.

:func:`series` is the one way in, whatever the range: longer ranges will be served from
hourly statistics kept elsewhere, behind the same function.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from . import sql
from .deliveries import Call, run


@dataclass(frozen=True, slots=True)
class Range:
    """A span of time the dashboard can show, and the width of one point of it."""

    #: The value of the dashboard's ``range`` parameter.
    key: str
    label: str
    span: datetime.timedelta
    step: datetime.timedelta


#: The last hour, minute by minute, read live from pgmb's tables.
LIVE = Range("1h", "last hour", datetime.timedelta(hours=1), datetime.timedelta(minutes=1))

#: Every range, by key (longer ones will come from hourly statistics).
RANGES: dict[str, Range] = {LIVE.key: LIVE}


@dataclass(frozen=True, slots=True)
class Point:
    """One step of a series (a minute of the live range), named by its start."""

    at: datetime.datetime
    #: Acknowledged attempts.
    delivered: int
    #: Failed attempts (retried, expired or dead-lettered), as the lists' "failed (1 h)".
    failed: int
    #: Of the failed attempts, those that moved their delivery to the dead letters.
    dead_lettered: int
    #: Request durations of the attempts (None: no attempt had one).
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    #: Live deliveries at the end of the step (at now() for the last one).
    depth: int
    #: Messages published in the step that matched no queue (of all queues, whatever the
    #: queue or worker asked for).
    unrouted: int


def _points(names: list[str], rows: list[tuple[Any, ...]]) -> list[Point]:
    return [Point(**dict(zip(names, row, strict=True))) for row in rows]


def series_call(
    range: Range = LIVE, queue: str | None = None, worker: str | None = None
) -> Call[list[Point]]:
    if range != LIVE:
        raise ValueError(f"no series for the range {range.key!r} yet (known: {', '.join(RANGES)})")
    return Call(
        sql.query("dashboard.sql", "live_minutes"), {"queue": queue, "worker": worker}, _points
    )


def series(
    range: Range = LIVE,
    queue: str | None = None,
    worker: str | None = None,
    *,
    using: str | None = None,
) -> list[Point]:
    """The points of ``range``, oldest first, for one queue, the queues of one worker, or
    every queue (both None). An unknown name has no attempts: its counts are zeros."""
    return run(series_call(range, queue, worker), using)
