"""pgmb.metrics(), pgmb.metrics_all() and pgmb.worker_metrics() on known data."""

from __future__ import annotations

import pytest

from pgmb import metrics

from .conftest import add_attempt


def test_metrics_all_counts_every_state(world, sql):
    by_name = {m.queue_name: m for m in metrics.queues()}
    assert list(by_name) == ["busy_queue", "idle_queue", "side_queue"]
    busy = by_name["busy_queue"]
    now = sql("SELECT now()")[0][0]
    assert busy == metrics.QueueMetrics(
        queue_name="busy_queue",
        queue_length=8,  # 7 ready (4 due, 2 delayed, 1 retry not due) + 1 leased
        queue_visible_length=4,
        newest_msg_age_sec=1.0,  # the newest delayed delivery
        oldest_msg_age_sec=200.0,  # the oldest *due* one, not the 1000 s old retry
        total_messages=15,  # 8 live + 2 dead + 5 acked (in and before the last hour)
        leased=1,
        retrying=2,
        dead_letters=2,
        delivered_last_hour=3,
        failed_last_hour=3,
        paused=False,
        scrape_time=now,
    )


def test_an_empty_queue_has_no_ages(world, sql):
    idle = metrics.queue("idle_queue")
    assert (idle.queue_length, idle.queue_visible_length, idle.total_messages) == (0, 0, 0)
    assert idle.newest_msg_age_sec is None and idle.oldest_msg_age_sec is None
    assert idle.paused is True
    side = metrics.queue("side_queue")
    assert (side.total_messages, side.delivered_last_hour, side.failed_last_hour) == (1, 1, 0)


def test_only_due_deliveries_make_the_oldest_age(world, sql):
    sql("DELETE FROM pgmb_delivery WHERE queue_id = %s AND available_at <= now()", (world.busy.pk,))
    busy = metrics.queue("busy_queue")
    assert busy.queue_visible_length == 0
    assert busy.oldest_msg_age_sec is None  # delayed and not-yet-due retries do not count
    assert busy.newest_msg_age_sec == 1.0


def test_one_queue_equals_its_row_of_all(world):
    assert metrics.queue("busy_queue") == next(
        m for m in metrics.queues() if m.queue_name == "busy_queue"
    )


def test_an_unknown_queue_is_an_error(world, sql, raises_sql):
    with raises_sql("42704", "queue 'no_such_queue' does not exist"):
        sql("SELECT * FROM pgmb.metrics('no_such_queue')")
    with raises_sql("42704", "queue NULL does not exist"):
        sql("SELECT * FROM pgmb.metrics(NULL)")


def test_worker_metrics(world, sql):
    by_name = {w.worker_name: w for w in metrics.workers()}
    assert list(by_name) == ["idle_worker", "metrics_worker"]
    now = sql("SELECT now()")[0][0]
    (five_minutes_ago, two_minutes_ago) = sql(
        "SELECT now() - interval '5 minutes', now() - interval '2 minutes'"
    )[0]
    w = by_name["metrics_worker"]
    # Both queues' last hour: busy 3 acks + 3 failures, side 1 ack; durations 10..70 ms.
    durations = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0]
    rank = 0.95 * (len(durations) - 1)
    low = int(rank)
    p95 = durations[low] + (rank - low) * (durations[low + 1] - durations[low])
    assert w == metrics.WorkerMetrics(
        worker_name="metrics_worker",
        active=True,
        requests_last_hour=7,
        successes_last_hour=4,
        success_rate=pytest.approx(4 / 7),
        p95_latency_ms=pytest.approx(p95),
        last_success_at=five_minutes_ago,  # side_queue's ack
        last_error_status=503,
        last_error="HTTP 503: busy",
        last_error_at=two_minutes_ago,
        consecutive_failures=2,  # the dead and the retry after the last success
        scrape_time=now,
    )
    idle = by_name["idle_worker"]
    assert (idle.requests_last_hour, idle.successes_last_hour, idle.consecutive_failures) == (
        0,
        0,
        0,
    )
    assert idle.success_rate is None and idle.p95_latency_ms is None
    assert idle.last_success_at is None and idle.last_error_at is None


def test_failures_in_a_row_and_the_last_error_look_back_24_hours(world, sql):
    # The idle worker never succeeded: failures of the last 24 hours count, older ones not.
    add_attempt(sql, world.idle, "retry", "23 hours", status=502, error="bad gateway")
    add_attempt(sql, world.idle, "dead", "30 minutes", error="connection refused")
    add_attempt(sql, world.idle, "retry", "25 hours", status=500, error="too old")
    idle = next(w for w in metrics.workers() if w.worker_name == "idle_worker")
    assert idle.consecutive_failures == 2
    assert (idle.last_error_status, idle.last_error) == (None, "connection refused")
    assert idle.requests_last_hour == 1 and idle.success_rate == 0.0
    assert idle.last_success_at is None


def test_unsent_leases_are_neither_failures_nor_requests(world, sql):
    """An 'unsent' row of the history is a lease that expired before its request started
    (pgmb.reclaim_expired): the worker was not asked anything."""
    before_queue, before_worker = metrics.queue("busy_queue"), metrics.workers()
    add_attempt(sql, world.busy, "unsent", "1 minute", error="lease expired before ...")
    assert metrics.queue("busy_queue") == before_queue
    assert metrics.workers() == before_worker
