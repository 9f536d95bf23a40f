"""The circuit breaker of a worker, in SQL (pgmb/sql/schema/breakers.sql): what opens it,
what a claim does while it is open, the probe, the reset, and what it costs a worker without one.
Through the typed API (pgmb.deliveries, pgmb.breakers) on the test's connection."""

import json
import uuid

import psycopg
import pytest

import pgmb
from pgmb import breakers, deliveries, final_answers
from pgmb.db.conninfo import conninfo_from_django
from pgmb.deliveries import Failure, Success
from pgmb.models import DeadLetter, Delivery, Worker


def _fail(rows, status=503, error="HTTP 503: busy"):
    return deliveries.fail([Failure(r.delivery_id, r.lease_id, status, error) for r in rows])


def _ack(rows):
    return deliveries.ack([Success(r.delivery_id, 200) for r in rows])


def _state(worker) -> Worker:
    return Worker.objects.get(pk=worker.pk)


def _end_cooldown(sql, worker):
    sql(
        "UPDATE pgmb_worker SET breaker_until = now() - interval '1 second' WHERE id = %s",
        (worker.pk,),
    )


def _claim_one_by_one(n):
    rows = []
    for _ in range(n):
        rows += deliveries.claim(limit=1)
    return rows


@pytest.fixture
def guarded(make_worker, make_queue):
    """A worker whose breaker opens after 3 failures in a row, its queue, 10 messages."""
    worker = make_worker(breaker_failures=3, breaker_cooldown=30, breaker_cooldown_max=100)
    queue = make_queue("#", worker=worker)
    for n in range(10):
        pgmb.send("k", n)
    return worker, queue


def test_failures_in_a_row_open_it_and_claims_skip_the_worker(guarded):
    worker, queue = guarded
    rows = deliveries.claim(limit=3)
    assert _fail(rows[:2]) == 2
    assert _state(worker).breaker_state == "closed"
    assert _state(worker).breaker_streak == 2
    assert _fail(rows[2:]) == 1
    w = _state(worker)
    assert w.breaker_state == "open"
    assert w.breaker_reason == "3 failures in a row (last: HTTP 503: busy)"
    assert w.breaker_since is not None
    assert 29 < (w.breaker_until - w.breaker_since).total_seconds() <= 30
    # Held back: nothing is claimed, the deliveries stay ready and keep their attempts.
    assert deliveries.claim() == []
    states = sorted(queue.deliveries.values_list("state", "attempts"))
    assert states == [("ready", 0)] * 7 + [("ready", 1)] * 3


def test_a_success_ends_the_run_of_failures(guarded):
    worker, _ = guarded
    rows = _claim_one_by_one(5)
    _fail(rows[:2])
    _ack(rows[2:3])
    assert _state(worker).breaker_streak == 0
    _fail(rows[3:5])
    assert (_state(worker).breaker_state, _state(worker).breaker_streak) == ("closed", 2)


@pytest.mark.parametrize(
    ("status", "counts"),
    [
        (None, True),  # no answer: network error, timeout, expired lease
        (500, True),
        (503, True),
        (429, True),
        (408, True),
        (302, True),  # a redirect: the endpoint's URL is wrong
        (400, False),  # the message's fault: the endpoint answered
        (404, False),
        (422, False),
        (200, False),
    ],
)
def test_which_outcomes_count_as_the_endpoints_failures(sql, status, counts):
    assert sql("SELECT pgmb.breaker_counts(%s)", (status,)) == [(counts,)]


def test_a_4xx_is_the_messages_fault_and_does_not_open_it(guarded):
    worker, _ = guarded
    rows = deliveries.claim(limit=5)
    _fail(rows[:2])
    _fail(rows[2:5], status=422, error="HTTP 422: bad order")
    w = _state(worker)
    assert (w.breaker_state, w.breaker_streak) == ("closed", 0)


def test_after_the_cooldown_one_delivery_probes_and_its_success_closes(sql, guarded):
    worker, _ = guarded
    _fail(deliveries.claim(limit=3))
    _end_cooldown(sql, worker)
    [probe] = deliveries.claim()
    assert _state(worker).breaker_state == "half_open"
    assert _state(worker).breaker_probe == probe.lease_id
    assert deliveries.claim() == []  # one probe at a time
    _ack([probe])
    w = _state(worker)
    assert (w.breaker_state, w.breaker_trips, w.breaker_until) == ("closed", 0, None)
    assert w.breaker_reason == "the probe succeeded (HTTP 200)"
    assert len(deliveries.claim()) == 6  # the rest; the 3 that failed wait for their retry


def test_a_failed_probe_opens_it_again_for_longer_up_to_the_cap(sql, guarded):
    worker, _ = guarded
    _fail(deliveries.claim(limit=3))
    lengths = []
    for _ in range(3):
        _end_cooldown(sql, worker)
        [probe] = deliveries.claim()
        _fail([probe], status=None, error="could not connect: refused")
        w = _state(worker)
        assert w.breaker_state == "open"
        assert w.breaker_reason.startswith("the probe failed (could not connect: refused)")
        lengths.append(round((w.breaker_until - w.breaker_since).total_seconds()))
    assert lengths == [60, 100, 100]  # 30 s doubled per failed probe, capped at 100


def test_outcomes_of_requests_out_before_it_opened_do_not_decide(sql, guarded):
    worker, _ = guarded
    rows = deliveries.claim(limit=5)
    _fail(rows[:3])
    _ack(rows[3:4])  # was in flight when it opened
    assert _state(worker).breaker_state == "open"
    _end_cooldown(sql, worker)
    [probe] = deliveries.claim()
    _ack(rows[4:5])  # the same, while the probe is out
    assert _state(worker).breaker_state == "half_open"
    _fail([probe])
    assert _state(worker).breaker_state == "open"


def test_a_failure_rate_over_the_window_opens_it(make_worker, make_queue):
    worker = make_worker(breaker_rate=0.5, breaker_min_requests=6, breaker_window=60)
    make_queue("#", worker=worker)
    for n in range(10):
        pgmb.send("k", n)
    rows = deliveries.claim(limit=6)
    _ack(rows[0:1])
    _fail(rows[1:2])
    _ack(rows[2:3])
    _fail(rows[3:5])  # 3 of 5: not enough requests yet
    assert _state(worker).breaker_state == "closed"
    _ack(rows[5:6])  # 3 of 6, but a success never opens it
    assert _state(worker).breaker_state == "closed"
    _fail(deliveries.claim(limit=1))  # 4 of 7
    w = _state(worker)
    assert w.breaker_state == "open"
    assert w.breaker_reason == (
        "57% of the requests of the last 60 s failed (4 of 7; last: HTTP 503: busy)"
    )


def test_the_previous_window_counts_for_what_the_window_still_covers(sql, make_worker, make_queue):
    worker = make_worker(breaker_rate=0.5, breaker_min_requests=4, breaker_window=60)
    make_queue("#", worker=worker)
    for n in range(10):
        pgmb.send("k", n)
    _fail(deliveries.claim(limit=3))
    # The three failures fall in the window before, three quarters of it ago: a quarter of
    # them (0.75) still counts with the next requests.
    sql(
        "UPDATE pgmb_worker SET breaker_window_at = now() - interval '105 seconds' WHERE id = %s",
        (worker.pk,),
    )
    _ack(deliveries.claim(limit=2))
    _fail(deliveries.claim(limit=1))  # 1.75 of 3.75 requests: not yet 4
    assert _state(worker).breaker_state == "closed"
    w = _state(worker)
    assert (w.breaker_prev_requests, w.breaker_prev_failed) == (3, 3)
    assert (w.breaker_requests, w.breaker_failed) == (3, 1)
    _fail(deliveries.claim(limit=1))  # 2.75 of 4.75
    assert _state(worker).breaker_state == "open"


def test_an_expired_lease_of_a_started_request_counts_an_unsent_one_does_not(
    sql, make_worker, make_queue
):
    worker = make_worker(breaker_failures=1)
    make_queue("#", worker=worker)
    pgmb.send("k", 1)
    pgmb.send("k", 2)
    unsent, started = deliveries.claim(limit=2)
    deliveries.start([started])
    sql(
        "UPDATE pgmb_delivery SET available_at = now() - interval '1 second' WHERE id = %s",
        (unsent.delivery_id,),
    )
    assert deliveries.reclaim_expired() == 1
    assert _state(worker).breaker_state == "closed"
    sql(
        "UPDATE pgmb_delivery SET available_at = now() - interval '1 second' WHERE id = %s",
        (started.delivery_id,),
    )
    assert deliveries.reclaim_expired() == 1
    w = _state(worker)
    assert w.breaker_state == "open"
    assert (
        w.breaker_reason
        == "1 failures in a row (last: lease expired before an outcome was recorded)"
    )


def test_a_failure_fenced_off_by_its_lease_does_not_count(guarded):
    worker, _ = guarded
    rows = deliveries.claim(limit=3)
    stale = [Failure(r.delivery_id, uuid.UUID(int=1), 503, "late") for r in rows]
    assert deliveries.fail(stale) == 0
    assert _state(worker).breaker_streak == 0


def test_reset_closes_it_by_hand(guarded):
    worker, _ = guarded
    _fail(deliveries.claim(limit=3))
    assert breakers.reset([worker.pk]) == 1
    w = _state(worker)
    assert (w.breaker_state, w.breaker_reason, w.breaker_streak) == ("closed", "closed by hand", 0)
    assert len(deliveries.claim()) == 7
    assert breakers.reset([worker.pk]) == 0  # already closed


def test_turning_it_off_closes_it(guarded):
    worker, _ = guarded
    _fail(deliveries.claim(limit=3))
    Worker.objects.filter(pk=worker.pk).update(breaker_failures=None)
    assert _state(worker).breaker_state == "closed"
    assert len(deliveries.claim()) == 7


def test_next_wakeup_is_the_end_of_the_cooldown(guarded):
    _fail(deliveries.claim(limit=3))
    wake = deliveries.next_wakeup()
    assert wake is not None and 25 < wake <= 30


def test_a_worker_without_a_breaker_is_not_touched(make_worker, make_queue):
    worker = make_worker()
    guarded = make_worker(breaker_failures=1)
    make_queue("#", worker=worker)
    make_queue("other", worker=guarded)
    for n in range(5):
        pgmb.send("k", n)
    rows = deliveries.claim(limit=5)
    _fail(rows)
    w = _state(worker)
    assert (w.breaker_state, w.breaker_streak, w.breaker_requests, w.breaker_window_at) == (
        "closed",
        0,
        0,
        None,
    )
    assert _state(guarded).breaker_state == "closed"


def test_each_transition_is_announced_once(transactional_db, make_worker, make_queue):
    worker = make_worker(breaker_failures=2)
    make_queue("#", worker=worker)
    pgmb.send("k", 1)
    pgmb.send("k", 2)
    pgmb.send("k", 3)
    # A notice's fields are readable only while its handler runs.
    notices: list[tuple] = []
    rows = deliveries.claim(limit=2)
    call = deliveries.fail_call([Failure(r.delivery_id, r.lease_id, 500, "HTTP 500") for r in rows])
    with psycopg.connect(**conninfo_from_django("default"), autocommit=True) as conn:
        conn.add_notice_handler(
            lambda d: notices.append(
                (d.sqlstate, d.severity_nonlocalized, d.message_detail, breakers.transition(d))
            )
        )
        conn.execute(call.query, call.params)
    [(sqlstate, severity, detail, moved)] = notices
    assert (sqlstate, severity) == (breakers.NOTICE_SQLSTATE, "WARNING")
    reason = "2 failures in a row (last: HTTP 500)"
    assert json.loads(detail) == {"worker": worker.name, "state": "open", "reason": reason}
    assert moved == (worker.name, "open", reason)
    assert Delivery.objects.filter(state="ready", attempts=0).count() == 1


def test_saving_a_worker_read_before_a_transition_keeps_the_transition(guarded):
    worker, _ = guarded
    stale = Worker.objects.get(pk=worker.pk)  # closed, as the admin's form read it
    _fail(deliveries.claim(limit=3))
    stale.rps = 50
    stale.save()
    w = _state(worker)
    assert (w.rps, w.breaker_state) == (50, "open")


@pytest.mark.parametrize(
    ("dead", "error"),
    [(["5xx"], "HTTP 503: busy"), ([], final_answers.ABORTED + "HTTP 503: busy")],
    ids=["dead_statuses", "abort_header"],
)
def test_an_answer_that_stops_retries_still_counts_for_the_breaker(
    make_worker, make_queue, dead, error
):
    worker = make_worker(breaker_failures=2, dead_statuses=dead)
    make_queue("#", worker=worker)
    for n in range(2):
        pgmb.send("k", n)
    rows = deliveries.claim(limit=2)
    assert _fail(rows, 503, error) == 2
    # Dead-lettered after one attempt each, and heard by the breaker as two failures.
    assert not Delivery.objects.exists()
    assert list(DeadLetter.objects.values_list("attempts", "last_status")) == [(1, 503)] * 2
    assert _state(worker).breaker_state == "open"
