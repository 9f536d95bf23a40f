"""The dashboard's long ranges (24 hours, 7 days) come hour by hour from the Spark
pipeline's hourly statistics (pgmb_statistics): rows placed in known hours show up in
their step, hours without a row are zeros, and the page says how fresh the figures are."""

from __future__ import annotations

import datetime

import pytest

from pgmb import dashboard_series
from pgmb.models import HourlyStatistics

from .test_dashboard import DASHBOARD, svgs

pytestmark = pytest.mark.django_db

UTC = datetime.timezone.utc
NOW = datetime.datetime(2026, 11, 22, 15, 40, tzinfo=UTC)


def hour(hours_ago: int) -> datetime.datetime:
    """The start of the hour ``hours_ago`` before the one holding NOW."""
    return NOW.replace(minute=0) - datetime.timedelta(hours=hours_ago)


def row(at, delivered, failed=0, dead=0, *, queue="", worker="", p50=None, p95=None):
    return HourlyStatistics.objects.create(
        hour=at,
        queue_name=queue,
        worker_name=worker,
        attempts=delivered + failed,
        delivered=delivered,
        failed=failed,
        retried=failed - dead,
        dead_lettered=dead,
        expired=0,
        latency_p50_ms=p50,
        latency_p95_ms=p95,
    )


def points(range_, queue=None, worker=None, now=NOW):
    from pgmb.db.statements import run

    return run(dashboard_series.series_call(range_, queue, worker, now=now))


def test_a_day_is_24_hours_ending_with_the_current_one():
    found = points(dashboard_series.DAY)
    assert len(found) == 24
    assert found[-1].at == hour(0) and found[0].at == hour(23)
    assert all(p.delivered == p.failed == 0 and p.latency_p50_ms is None for p in found)
    assert all(p.depth is None and p.unrouted is None for p in found)


def test_rows_land_in_their_hour_and_the_week_reaches_further():
    row(hour(3), 120, 7, 2, p50=40.0, p95=95.5)
    row(hour(30), 5)
    day = {p.at: p for p in points(dashboard_series.DAY)}
    assert (day[hour(3)].delivered, day[hour(3)].failed, day[hour(3)].dead_lettered) == (120, 7, 2)
    assert (day[hour(3)].latency_p50_ms, day[hour(3)].latency_p95_ms) == (40.0, 95.5)
    assert hour(30) not in day
    week = points(dashboard_series.WEEK)
    assert len(week) == 7 * 24
    assert {p.at: p.delivered for p in week if p.delivered} == {hour(3): 120, hour(30): 5}


def test_a_queue_or_a_worker_reads_its_own_rows():
    row(hour(2), 100)  # every queue
    row(hour(2), 60, queue="orders", worker="shop")
    row(hour(2), 40, queue="mail", worker="mailer")
    row(hour(2), 60, worker="shop")  # the worker's total
    assert [p.delivered for p in points(dashboard_series.DAY, queue="orders") if p.delivered] == [
        60
    ]
    assert [p.delivered for p in points(dashboard_series.DAY, worker="mailer") if p.delivered] == []
    assert [p.delivered for p in points(dashboard_series.DAY, worker="shop") if p.delivered] == [60]
    assert [p.delivered for p in points(dashboard_series.DAY) if p.delivered] == [100]


def test_a_queue_that_changed_worker_in_the_hour_adds_up():
    row(hour(1), 30, 3, queue="orders", worker="old", p50=10.0)
    row(hour(1), 70, 1, queue="orders", worker="new", p50=20.0)
    [point] = [p for p in points(dashboard_series.DAY, queue="orders") if p.delivered]
    assert (point.delivered, point.failed) == (100, 4)
    assert point.latency_p50_ms == 20.0  # the busier row's


def test_the_page_charts_a_day_from_the_statistics(admin_client):
    now = datetime.datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    row(now - datetime.timedelta(hours=2), 321, 9, 4, p50=12.0, p95=80.0)
    response = admin_client.get(DASHBOARD, {"range": "24h"})
    assert response.status_code == 200
    html = response.content.decode()
    assert len(svgs(response)) == 2  # outcomes and latency: no depth, no unrouted
    assert "Last 24 hours: 321 delivered, 9 failed (4 of them dead-lettered)." in html
    assert "computed up to the hour of" in html
    assert 'id="pgmb-queues"' in html  # the tables are the live ones, as ever


def test_the_page_says_when_there_are_no_statistics_yet(admin_client):
    response = admin_client.get(DASHBOARD, {"range": "7d"})
    assert response.status_code == 200
    assert "No hourly statistics yet" in response.content.decode()
    assert "manage.py pgmb_pipeline stats" in response.content.decode()


def test_an_hourly_range_costs_one_more_query_than_the_live_one(
    admin_client, django_assert_num_queries
):
    admin_client.get(DASHBOARD)  # warm up: the session
    # The live page's 8, and the statistics' newest hour.
    with django_assert_num_queries(9):
        admin_client.get(DASHBOARD, {"range": "24h"})
