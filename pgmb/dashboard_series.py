"""The dashboard's time series: what happened, minute by minute, to a queue, a worker or all.

::

    from pgmb import series
    points = series.series(series.LIVE, queue="order_queue")   # 61 Points, oldest first

One :class:`Point` per step holds the attempts that ended in it (delivered, failed,
dead-lettered) and a latency (p50, p95). The live range, the last hour, is minute by minute
and read from pgmb's own tables in one statement (``pgmb/sql/queries/dashboard.sql``,
``live_minutes``), with the same "last hour" as :mod:`pgmb.metrics`: each count's sum is
the figure of the queue and worker lists; its latency is the requests' ``duration_ms``, and
it also has the queue depth at each minute's end and the messages that no queue took.

The longer ranges (:data:`DAY`, :data:`WEEK`) are hour by hour, from the hourly statistics
that the Spark pipeline's ``stats`` job computes (:mod:`pgmb.hourly_stats`): as fresh as its
last run; their latency runs from publishing to the ack, and they have no depth and no
unrouted count (None). :func:`series` is the one way in, whatever the range.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from . import hourly_stats, sql
from .db.statements import Call, run


@dataclass(frozen=True, slots=True)
class Range:
    """A span of time the dashboard can show, and the width of one point of it."""

    #: The value of the dashboard's ``range`` parameter.
    key: str
    label: str
    span: datetime.timedelta
    step: datetime.timedelta

    @property
    def live(self) -> bool:
        """Read from pgmb's tables (else from the hourly statistics)."""
        return self.step < HOUR


HOUR = datetime.timedelta(hours=1)
#: The last hour, minute by minute, read live from pgmb's tables.
LIVE = Range("1h", "last hour", HOUR, datetime.timedelta(minutes=1))
#: The last 15 minutes, minute by minute: the live hour's last 16 points.
RECENT = Range("15m", "last 15 minutes", datetime.timedelta(minutes=15), LIVE.step)
#: The last day and week, hour by hour, from the pipeline's statistics.
DAY = Range("24h", "last 24 hours", datetime.timedelta(days=1), HOUR)
WEEK = Range("7d", "last 7 days", datetime.timedelta(days=7), HOUR)

#: Every range, by key, shortest first.
RANGES: dict[str, Range] = {r.key: r for r in (RECENT, LIVE, DAY, WEEK)}


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
    #: Deliveries whose time to live ran out before they were posted (history outcome
    #: 'ttl', not an attempt: "expired (TTL)"); None in the hourly ranges, whose statistics
    #: do not count them.
    expired_ttl: int | None
    #: Live range: request durations of the attempts; hourly ranges: from publishing to
    #: the ack (None: nothing to measure).
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    #: Live deliveries at the end of the step (at now() for the last one); None in the
    #: hourly ranges.
    depth: int | None
    #: Messages published in the step that matched no queue (of all queues, whatever the
    #: queue or worker asked for); None in the hourly ranges.
    unrouted: int | None


def _points(names: list[str], rows: list[tuple[Any, ...]]) -> list[Point]:
    return [Point(**dict(zip(names, row, strict=True))) for row in rows]


def _recent(points: list[Point]) -> list[Point]:
    """The last 15 minutes of the live hour: the minute holding now() - 15 minutes to now's.
    Each point of the hour is complete in itself (a depth is the count at the end of its
    minute), so the last ones are the shorter range as it is."""
    return points[-(RECENT.span // RECENT.step + 1) :]


def _recent_points(names: list[str], rows: list[tuple[Any, ...]]) -> list[Point]:
    return _recent(_points(names, rows))


def fitted(points: list[Point]) -> tuple[Range, list[Point]]:
    """The range the dashboard opens on, and its points, from the live hour's: the last 15
    minutes when nothing happened before them (a short history, as on a new install, is not
    a sliver at the right edge of an hour), else the hour."""
    recent = _recent(points)
    earlier = points[: len(points) - len(recent)]
    if any(p.delivered or p.failed or p.expired_ttl or p.unrouted or p.depth for p in earlier):
        return LIVE, points
    return RECENT, recent


def series_call(
    range: Range = LIVE,
    queue: str | None = None,
    worker: str | None = None,
    now: datetime.datetime | None = None,
) -> Call[list[Point]]:
    """The statement of :func:`series`; ``now`` places an hourly range (default: now)."""
    if range.live:
        return Call(
            sql.query("dashboard.sql", "live_minutes"),
            {"queue": queue, "worker": worker},
            _recent_points if range == RECENT else _points,
        )
    # The hour in progress is the last step: the job fills it on its next run.
    moment = now or datetime.datetime.now(datetime.timezone.utc)
    until = moment.replace(minute=0, second=0, microsecond=0) + HOUR
    since = until - range.span
    call = hourly_stats.hourly_call(since, until, queue, worker)

    def points(names: list[str], rows: list[tuple[Any, ...]]) -> list[Point]:
        found: dict[datetime.datetime, Point] = {}
        for row in call.read(names, rows):
            point = Point(
                row.hour,
                row.delivered,
                row.failed,
                row.dead_lettered,
                None,
                row.latency_p50_ms,
                row.latency_p95_ms,
                None,
                None,
            )
            if (seen := found.get(row.hour)) is not None:
                # A queue whose worker changed in the hour has a row per worker: the counts
                # add up; percentiles do not, the busier row's stand for the hour.
                busier = seen if seen.delivered >= row.delivered else point
                point = Point(
                    row.hour,
                    seen.delivered + row.delivered,
                    seen.failed + row.failed,
                    seen.dead_lettered + row.dead_lettered,
                    None,
                    busier.latency_p50_ms,
                    busier.latency_p95_ms,
                    None,
                    None,
                )
            found[row.hour] = point
        out = []
        at = since
        while at < until:
            out.append(found.get(at) or Point(at, 0, 0, 0, None, None, None, None, None))
            at += HOUR
        return out

    return Call(call.query, call.params, points)


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
