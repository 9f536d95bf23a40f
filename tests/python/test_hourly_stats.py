"""pgmb.hourly_stats: the hourly rows as the dashboard reads them, one statement a call."""

from __future__ import annotations

import datetime

import pytest

from pgmb import hourly_stats
from pgmb.hourly_stats import ErrorCount, HourRow
from pgmb.models import HourlyStatistics

UTC = datetime.timezone.utc
T = datetime.datetime(2024, 5, 1, 10, tzinfo=UTC)
HOUR = datetime.timedelta(hours=1)


def put(hour, queue, worker, delivered, top=()):
    HourlyStatistics.objects.create(
        hour=hour,
        queue_name=queue,
        worker_name=worker,
        attempts=delivered + 1,
        delivered=delivered,
        failed=1,
        retried=1,
        dead_lettered=0,
        expired=0,
        attempts_per_message=1.5,
        latency_p50_ms=10.0,
        latency_p95_ms=20.0,
        latency_p99_ms=30.0,
        top_errors=[{"status": s, "count": c} for s, c in top],
    )


@pytest.fixture
def hours(db):
    for i in range(3):
        hour = T + i * HOUR
        put(hour, "orders", "alpha", 10 + i, [(503, 1)])
        put(hour, "", "alpha", 10 + i, [(503, 1)])
        put(hour, "mail", "beta", 20 + i, [(None, 1)])
        put(hour, "", "beta", 20 + i, [(None, 1)])
        put(hour, "", "", 30 + i, [(503, 1), (None, 1)])


def delivered(rows):
    return [(r.hour, r.queue_name, r.worker_name, r.delivered) for r in rows]


def test_totals_by_default(hours, django_assert_num_queries):
    with django_assert_num_queries(1):
        rows = hourly_stats.hourly(T, T + 3 * HOUR)
    assert delivered(rows) == [(T, "", "", 30), (T + HOUR, "", "", 31), (T + 2 * HOUR, "", "", 32)]
    assert rows[0] == HourRow(
        hour=T,
        queue_name="",
        worker_name="",
        attempts=31,
        delivered=30,
        failed=1,
        retried=1,
        dead_lettered=0,
        expired=0,
        attempts_per_message=1.5,
        latency_p50_ms=10.0,
        latency_p95_ms=20.0,
        latency_p99_ms=30.0,
        top_errors=(ErrorCount(503, 1), ErrorCount(None, 1)),
    )


def test_a_worker_a_queue_and_both(hours):
    assert delivered(hourly_stats.hourly(T, T + 2 * HOUR, worker="beta")) == [
        (T, "", "beta", 20),
        (T + HOUR, "", "beta", 21),
    ]
    assert delivered(hourly_stats.hourly(T, T + HOUR, queue="orders")) == [
        (T, "orders", "alpha", 10)
    ]
    assert hourly_stats.hourly(T, T + HOUR, queue="orders", worker="beta") == []
    assert delivered(hourly_stats.hourly(T, T + HOUR, queue="mail", worker="beta")) == [
        (T, "mail", "beta", 20)
    ]
    assert hourly_stats.hourly(T, T + HOUR, queue="nope") == []


def test_hours_that_overlap_the_range(hours):
    # 10:30 to 11:30 overlaps the hours of 10:00 and 11:00, not 12:00.
    rows = hourly_stats.hourly(T + HOUR / 2, T + HOUR + HOUR / 2)
    assert [r.hour for r in rows] == [T, T + HOUR]
    assert hourly_stats.hourly(T + 3 * HOUR, T + 4 * HOUR) == []


def test_latest(db, hours):
    assert hourly_stats.latest() == T + 2 * HOUR
    HourlyStatistics.objects.all().delete()
    assert hourly_stats.latest() is None


@pytest.mark.parametrize(
    ("hour", "constraint"),
    [
        (T + datetime.timedelta(minutes=1), "pgmb_statistics_whole_hour"),
        (T, "pgmb_statistics_counts"),
    ],
)
def test_the_table_refuses_rows_that_do_not_add_up(db, raises_sql, hour, constraint):
    with raises_sql("23514", constraint):
        HourlyStatistics.objects.create(
            hour=hour,
            queue_name="q",
            worker_name="w",
            attempts=3 if hour == T else 1,
            delivered=1,
            failed=0,
            retried=0,
            dead_lettered=0,
            expired=0,
        )
