"""Health at a glance: the queue and worker lists' figures (the same as pgmb.metrics'),
the workers' health badges, the pages' query counts, and the estimated paginator of the
message lists (the lists on big tables: test_big_tables.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from pgmb import metrics
from pgmb.admin import health
from pgmb.admin.paginator import EXACT_BELOW, EstimatedCountPaginator
from pgmb.metrics import WorkerMetrics
from pgmb.models import Attempt
from tests.metrics.conftest import add_attempt, world  # noqa: F401

from .conftest import table_rows, url


def cells(row: str) -> dict[str, str]:
    """{column: text} of a changelist row."""
    found = re.findall(r'<t[dh] class="field-(\w+)[^"]*"[^>]*>(.*?)</t[dh]>', row, re.S)
    return {name: re.sub(r"<[^>]+>", "", html).strip() for name, html in found}


def page_fields(html: str) -> dict[str, str]:
    """{field: text} of an object page's read-only fields."""
    found = re.findall(
        r'<div class="form-row field-(\w+)[^"]*">.*?<div class="readonly">(.*?)</div>', html, re.S
    )
    return {name: re.sub(r"<[^>]+>", "", text).strip() for name, text in found}


def figures_by_name(client, model: str) -> dict[str, dict[str, str]]:
    """{name: {column: text}}: each row of the list, with the figures its page adds (the
    list shows what fits a screen, the page all of them)."""
    found = {}
    for row in table_rows(client.get(url(f"{model}_changelist"))):
        shown = cells(row)
        page = re.search(r'href="([^"]*/change/)"', row).group(1)
        found[shown["name"]] = {**page_fields(client.get(page).content.decode()), **shown}
    return found


# The queue list.


def test_queue_columns_show_known_figures(admin_client, world):  # noqa: F811
    rows = figures_by_name(admin_client, "queue")

    busy = rows["busy_queue"]
    # 4 due, 3 not due (2 delayed, a retry), 1 leased; 2 retrying; 2 dead letters; the
    # oldest due one published 200 s ago; 3 acks and 3 failures in the last hour.
    assert {k: busy[k] for k in ("pending", "ready", "delayed", "leased", "retrying")} == {
        "pending": "8",
        "ready": "4",
        "delayed": "3",
        "leased": "1",
        "retrying": "2",
    }
    assert (busy["dead_letters"], busy["oldest_due"]) == ("2", "3m")
    assert (busy["delivered_last_hour"], busy["failed_last_hour"]) == ("3", "3")
    side = rows["side_queue"]
    assert (side["ready"], side["oldest_due"], side["delivered_last_hour"]) == ("0", "-", "1")
    idle = rows["idle_queue"]
    assert (idle["ready"], idle["delayed"], idle["failed_last_hour"]) == ("0", "0", "0")
    assert "paused" in idle["state"]


def test_queue_columns_are_the_metrics(admin_client, world):  # noqa: F811
    rows = figures_by_name(admin_client, "queue")

    for m in metrics.queues():
        row = rows[m.queue_name]
        assert row["ready"] == str(m.queue_visible_length)
        assert row["leased"] == str(m.leased)
        assert int(row["delayed"]) + int(row["ready"]) + int(row["leased"]) == m.queue_length
        assert row["retrying"] == str(m.retrying)
        assert row["dead_letters"] == str(m.dead_letters)
        assert row["oldest_due"] == health.age(m.oldest_msg_age_sec)
        assert row["delivered_last_hour"] == str(m.delivered_last_hour)
        assert row["failed_last_hour"] == str(m.failed_last_hour)


# The worker list.


def test_worker_columns_show_known_figures(admin_client, world):  # noqa: F811
    rows = figures_by_name(admin_client, "worker")

    busy = rows["metrics_worker"]
    # 7 requests in the last hour (6 on busy_queue, 1 on side_queue), 4 of them acked; two
    # failures since the last success (5 minutes ago), the newest a 503.
    assert (busy["requests_last_hour"], busy["success_rate"]) == ("7", "57.1%")
    assert busy["p95_latency"] == "67.0 ms"
    assert busy["last_success"] == "5\xa0minutes ago"
    assert busy["last_error"] == "503: HTTP 503: busy"
    assert busy["consecutive_failures"] == "2"
    assert busy["health"] == "healthy"
    idle = rows["idle_worker"]
    assert (idle["requests_last_hour"], idle["success_rate"], idle["p95_latency"]) == (
        "0",
        "-",
        "-",
    )
    assert (idle["last_success"], idle["last_error"], idle["health"]) == ("-", "-", "idle")


def test_worker_columns_are_the_metrics(admin_client, world):  # noqa: F811
    rows = figures_by_name(admin_client, "worker")

    for w in metrics.workers():
        row = rows[w.worker_name]
        assert row["requests_last_hour"] == str(w.requests_last_hour)
        rate = "-" if w.success_rate is None else f"{w.success_rate:.1%}"
        assert row["success_rate"] == rate
        p95 = "-" if w.p95_latency_ms is None else f"{w.p95_latency_ms:.1f} ms"
        assert row["p95_latency"] == p95
        assert row["consecutive_failures"] == str(w.consecutive_failures)
        assert row["health"] == str(health.HEALTH_LABELS[health.worker_health(w)])


def test_long_errors_are_truncated_with_the_whole_text_in_a_title(
    admin_client, sql, make_worker, make_queue
):
    worker = make_worker("chatty")
    queue = make_queue("#", worker=worker)
    text = "HTTP 500: " + "x" * 200
    add_attempt(sql, queue, "retry", "1 minute", status=500, duration=5, error=text)

    (row,) = table_rows(admin_client.get(url("worker_changelist")))

    assert f'title="500: {text}"' in row
    shown = cells(row)["last_error"]
    assert len(shown) == health.ERROR_CHARS and shown.endswith("…")
    # The worker's page has the whole of it.
    whole = figures_by_name(admin_client, "worker")["chatty"]["whole_last_error"]
    assert whole.startswith(f"500: {text} (")


# Health: the rules, then each state on the page.


def figures(**changes) -> WorkerMetrics:
    base = dict(
        worker_name="w",
        active=True,
        requests_last_hour=20,
        successes_last_hour=20,
        success_rate=1.0,
        p95_latency_ms=10.0,
        last_success_at=None,
        last_error_status=None,
        last_error=None,
        last_error_at=None,
        consecutive_failures=0,
        scrape_time=datetime(2026, 1, 1, tzinfo=UTC),
    )
    base.update(changes)
    return WorkerMetrics(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "state"),
    [
        ({}, "healthy"),
        ({"consecutive_failures": 2}, "healthy"),
        ({"consecutive_failures": 3}, "failing"),
        # Below 50 % over at least 10 requests; fewer requests are noise.
        ({"requests_last_hour": 10, "successes_last_hour": 4, "success_rate": 0.4}, "failing"),
        ({"requests_last_hour": 10, "successes_last_hour": 5, "success_rate": 0.5}, "healthy"),
        ({"requests_last_hour": 9, "successes_last_hour": 0, "success_rate": 0.0}, "healthy"),
        ({"requests_last_hour": 0, "successes_last_hour": 0, "success_rate": None}, "idle"),
        # Failures older than the hour still make it failing: nothing has succeeded since.
        ({"requests_last_hour": 0, "success_rate": None, "consecutive_failures": 5}, "failing"),
        ({"active": False, "consecutive_failures": 9}, "paused"),
        ({"active": False, "requests_last_hour": 0, "success_rate": None}, "paused"),
    ],
)
def test_health_rules(changes, state):
    assert health.worker_health(figures(**changes)) == state


def test_each_health_badge_on_the_page(admin_client, sql, make_worker, make_queue):
    def worker_with(name: str, outcomes: list[tuple[str, str]], **kw):
        queue = make_queue("#", worker=make_worker(name, **kw))
        for outcome, ago in outcomes:
            add_attempt(sql, queue, outcome, ago, status=200 if outcome == "ack" else 503)

    worker_with("ok", [("ack", "1 minute"), ("retry", "2 minutes")])
    worker_with("broken", [("ack", "9 minutes")] + [("retry", f"{m} minutes") for m in (1, 2, 3)])
    # 10 requests, 4 acks, never 3 failures in a row: failing by its success rate.
    pattern = "afafaffaff"
    worker_with("flaky", [("ack" if c == "a" else "retry", f"{i + 1} minutes")
                          for i, c in enumerate(pattern)])  # fmt: skip
    worker_with("quiet", [("ack", "2 hours")])
    worker_with("stopped", [("retry", "1 minute")] * 4, active=False)

    response = admin_client.get(url("worker_changelist"))
    rows = figures_by_name(admin_client, "worker")

    assert {name: row["health"] for name, row in rows.items()} == {
        "ok": "healthy",
        "broken": "failing",
        "flaky": "failing",
        "quiet": "idle",
        "stopped": "paused",
    }
    assert rows["flaky"]["success_rate"] == "40.0%"
    assert rows["flaky"]["consecutive_failures"] == "0"
    assert rows["broken"]["consecutive_failures"] == "3"
    assert 'class="pgmb-health pgmb-health-failing"' in response.content.decode()


# Query counts: one metrics query per page, whatever its rows.


@pytest.mark.parametrize("model", ["queue", "worker"])
def test_list_queries_do_not_grow_with_rows(
    admin_client, sql, make_worker, make_queue, count_queries, django_assert_num_queries, model
):
    def add(n: int) -> None:
        for _ in range(n):
            queue = make_queue("#", worker=make_worker())
            add_attempt(sql, queue, "ack", "1 minute", status=200, duration=3)
            add_attempt(sql, queue, "retry", "2 minutes", status=503, error="busy")

    add(3)
    admin_client.get(url(f"{model}_changelist"))  # warm up: the session, caches
    few = count_queries(lambda: admin_client.get(url(f"{model}_changelist")))
    add(27)

    with django_assert_num_queries(few) as captured:
        response = admin_client.get(url(f"{model}_changelist"))

    rows = [cells(row) for row in table_rows(response)]
    assert len(rows) == 30
    function = "pgmb.metrics_all()" if model == "queue" else "pgmb.worker_metrics()"
    assert sum(function in q["sql"] for q in captured.captured_queries) == 1
    if model == "worker":
        assert {row["requests_last_hour"] for row in rows} == {"2"}
    else:
        assert {row["delivered_last_hour"] for row in rows} == {"1"}


# The estimated paginator.


def add_attempts(sql, queue, n: int) -> None:
    """n attempts of one queue, 1 in 10 of them dead, generated in SQL."""
    sql(
        "INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code,"
        " duration_ms, error, created_at)"
        " SELECT gen_random_uuid(), %s, 1, CASE WHEN i %% 10 = 0 THEN 'dead' ELSE 'ack' END,"
        " 200, 1, '', now() - i * interval '1 second' FROM generate_series(1, %s) AS i",
        (queue.pk, n),
    )


def counts(captured) -> list[str]:
    return [q["sql"] for q in captured if re.search(r"COUNT\(\*\)", q["sql"], re.I)]


def test_paginator_counts_exactly_below_the_threshold(fresh_statistics, sql, make_queue):
    queue = make_queue("#")
    add_attempts(sql, queue, 50)
    sql("ANALYZE pgmb_attempt")

    with CaptureQueriesContext(connection) as captured:
        count = EstimatedCountPaginator(Attempt.objects.order_by("id"), 100).count
        dead = EstimatedCountPaginator(
            Attempt.objects.filter(outcome="dead").order_by("id"), 100
        ).count

    assert (count, dead) == (50, 5)
    assert len(counts(captured)) == 2


def test_paginator_estimates_above_the_threshold(fresh_statistics, sql, make_queue):
    queue = make_queue("#")
    n = 2 * EXACT_BELOW
    add_attempts(sql, queue, n)
    sql("ANALYZE pgmb_attempt")
    (reltuples,) = sql("SELECT reltuples::bigint FROM pg_class WHERE relname = 'pgmb_attempt'")[0]

    with CaptureQueriesContext(connection) as captured:
        everything = EstimatedCountPaginator(Attempt.objects.order_by("id"), 100).count
        acked = EstimatedCountPaginator(
            Attempt.objects.filter(outcome="ack").order_by("id"), 100
        ).count
        dead = EstimatedCountPaginator(
            Attempt.objects.filter(outcome="dead").order_by("id"), 100
        ).count

    assert everything == reltuples
    # The acked are 90 %: the plan's estimate, close to it; the dead (10 %: under the
    # threshold) are counted.
    assert abs(acked - 0.9 * n) < 0.1 * n
    assert dead == n // 10
    assert len(counts(captured)) == 1 and "'dead'" in counts(captured)[0]
    assert any(q["sql"].startswith("EXPLAIN (FORMAT JSON)") for q in captured)


def test_small_lists_keep_exact_counts_on_the_page(fresh_statistics, admin_client, sql, make_queue):
    queue = make_queue("#")
    add_attempts(sql, queue, 30)
    sql("ANALYZE pgmb_attempt")

    response = admin_client.get(url("attempt_changelist"))

    assert response.context["cl"].result_count == 30
    assert "30 attempts" in response.content.decode()


def test_the_exact_count_stops_at_its_bound(fresh_statistics, sql, make_queue):
    """A list the planner takes for small but that is not costs a bounded count."""
    queue = make_queue("#")
    add_attempts(sql, queue, 50)
    sql("ANALYZE pgmb_attempt")

    class Bounded(EstimatedCountPaginator):
        exact_below = 10**9  # every estimate is "small": always count
        count_at_most = 20

    with CaptureQueriesContext(connection) as captured:
        count = Bounded(Attempt.objects.order_by("id"), 10).count

    assert count == 20
    (statement,) = counts(captured)
    assert "LIMIT 20" in statement
