"""Start marks (pgmb.start) and what an expired lease costs: an attempt when its request
started, nothing when it never did, except from a delivery's third such expiry on."""

import dataclasses
import uuid

import pytest

import pgmb
from pgmb import deliveries
from pgmb.deliveries import Failure, Recorded, Success
from pgmb.models import Attempt, DeadLetter, Delivery

#: Unstarted expiries of one delivery that are forgiven; the next ones count.
FORGIVEN = 2


@pytest.fixture
def claim(db):
    def run(n: int = 100) -> list[deliveries.Claimed]:
        return deliveries.claim(None, n)

    return run


def _expire_leases(sql) -> None:
    sql("UPDATE pgmb_delivery SET available_at = now() - interval '1 s' WHERE state = 'leased'")


def _history(message_id) -> list[tuple[int, str]]:
    return list(
        Attempt.objects.filter(message_id=message_id)
        .order_by("id")
        .values_list("attempt", "outcome")
    )


def test_a_mark_is_fenced_by_its_lease_and_counts_once(make_queue, claim):
    make_queue("#")
    pgmb.send("k", 1)
    [row] = claim()
    assert Delivery.objects.get().started is False
    stranger = dataclasses.replace(row, lease_id=uuid.uuid4())
    assert deliveries.start([stranger]) == 0
    assert Delivery.objects.get().started is False
    assert deliveries.start([row]) == 1
    assert deliveries.start([row, row]) == 0  # marked already
    assert Delivery.objects.get().started is True
    assert deliveries.start([]) == 0


def test_a_mark_after_the_outcome_changes_nothing(make_queue, claim, sql):
    make_queue("#", max_retries=3, backoff_base=0, backoff_max=0)
    acked_id, failed_id, released_id = pgmb.send_batch(("k", n) for n in range(3))
    rows = {r.message_id: r for r in claim()}
    acked, failed, released = (rows[str(i)] for i in (acked_id, failed_id, released_id))
    deliveries.ack([Success(acked.delivery_id, 200)])
    deliveries.fail([Failure(failed.delivery_id, failed.lease_id, 500, "no")])
    deliveries.release([released])
    assert deliveries.start([acked, failed, released]) == 0
    left = Delivery.objects.order_by("id")
    assert [(d.state, d.started, d.attempts) for d in left] == [
        ("ready", False, 1),  # the failure counted its attempt
        ("ready", False, 0),  # the release handed it back
    ]
    assert _history(acked_id) == [(1, "ack")]
    assert _history(failed_id) == [(1, "retry")]
    # A new lease starts unmarked, and the old lease's mark does not reach it.
    again = claim()
    assert deliveries.start([failed, released]) == 0
    assert set(Delivery.objects.values_list("started", flat=True)) == {False}
    assert deliveries.start(again) == 2


def test_outcomes_count_the_same_whether_or_not_the_mark_landed(make_queue, claim):
    make_queue("#", max_retries=0)
    ids = pgmb.send_batch(("k", n) for n in range(4))
    rows = {r.message_id: r for r in claim()}
    first, second, third, fourth = (rows[str(i)] for i in ids)
    deliveries.start([first, third])
    deliveries.ack([Success(first.delivery_id), Success(second.delivery_id)])
    deliveries.fail([Failure(r.delivery_id, r.lease_id, 500, "no") for r in (third, fourth)])
    assert [_history(i) for i in ids] == [[(1, "ack")], [(1, "ack")], [(1, "dead")], [(1, "dead")]]
    assert set(DeadLetter.objects.values_list("attempts", flat=True)) == {1}


def test_an_unstarted_expiry_hands_the_attempt_back(make_queue, claim, sql):
    make_queue("#", max_retries=0)
    mid = pgmb.send("k", 1)
    [row] = claim()
    assert row.attempt == 1
    _expire_leases(sql)
    assert deliveries.reclaim_expired() == 1
    delivery = Delivery.objects.get()
    assert (delivery.state, delivery.attempts, delivery.unsent_leases) == ("ready", 0, 1)
    assert delivery.lease_id is None
    assert sql("SELECT available_at <= clock_timestamp() FROM pgmb_delivery") == [(True,)]
    assert not DeadLetter.objects.exists()
    unsent = Attempt.objects.get(message_id=mid)
    assert (unsent.attempt, unsent.outcome, unsent.status_code) == (1, "unsent", None)
    assert "not counted" in unsent.error
    # Its one attempt is still there to spend.
    [again] = claim()
    assert (again.attempt, again.last_attempt) == (1, True)
    deliveries.ack([Success(again.delivery_id, 200)])
    assert _history(mid) == [(1, "unsent"), (1, "ack")]


def test_a_started_expiry_counts_and_dead_letters_at_the_limit(make_queue, claim, sql):
    make_queue("#", max_retries=0)
    mid = pgmb.send("k", 1)
    deliveries.start(claim())
    _expire_leases(sql)
    assert deliveries.reclaim_expired() == 1
    assert not Delivery.objects.exists()
    dead = DeadLetter.objects.get()
    assert (dead.attempts, dead.last_error) == (1, "lease expired before an outcome was recorded")
    assert _history(mid) == [(1, "dead")]


def test_unstarted_expiries_count_from_the_third_on(make_queue, claim, sql):
    """A message whose request kills its dispatcher before the mark is written would
    otherwise come back forever: its third unstarted expiry counts, so it dead-letters."""
    make_queue("#", max_retries=1, backoff_base=0, backoff_max=0)
    mid = pgmb.send("k", 1)
    for _ in range(FORGIVEN):
        [row] = claim()
        assert row.attempt == 1
        _expire_leases(sql)
        assert deliveries.reclaim_expired() == 1
    assert Delivery.objects.get().unsent_leases == FORGIVEN
    for attempt in (1, 2):
        [row] = claim()
        assert row.attempt == attempt
        _expire_leases(sql)
        assert deliveries.reclaim_expired() == 1
        sql("UPDATE pgmb_delivery SET available_at = now() - interval '1 s'")
    assert not Delivery.objects.exists()
    dead = DeadLetter.objects.get()
    assert dead.attempts == 2
    assert dead.last_error.startswith("lease expired before its request was marked started")
    assert f"{FORGIVEN} earlier leases" in dead.last_error
    assert _history(mid) == [(1, "unsent"), (1, "unsent"), (1, "expired"), (2, "dead")]


def test_one_reclaim_settles_started_and_unstarted_leases(make_queue, claim, sql):
    make_queue("#", max_retries=0)
    ids = pgmb.send_batch(("k", n) for n in range(6))
    rows = claim()
    started = [r for r in rows if r.message_id in {str(i) for i in ids[:2]}]
    deliveries.start(started)
    _expire_leases(sql)
    assert deliveries.reclaim_expired(limit=100) == 6
    assert {str(m) for m in DeadLetter.objects.values_list("message_id", flat=True)} == {
        str(i) for i in ids[:2]
    }
    left = Delivery.objects.all()
    assert sorted(str(d.message_id) for d in left) == sorted(str(i) for i in ids[2:])
    assert {(d.state, d.attempts, d.unsent_leases) for d in left} == {("ready", 0, 1)}
    assert deliveries.reclaim_expired() == 0


def test_record_writes_marks_acks_and_failures_in_one_query(
    make_queue, claim, django_assert_num_queries
):
    make_queue("#", max_retries=0)
    pgmb.send_batch(("k", n) for n in range(5))
    first, second, third, fourth, fifth = claim()
    with django_assert_num_queries(1):
        recorded = deliveries.record(
            [first, second, fifth],  # fifth: its outcome comes in the same write
            [Success(third.delivery_id, 200), Success(fifth.delivery_id, 200)],
            [Failure(fourth.delivery_id, fourth.lease_id, 500, "no")],
        )
    assert recorded == Recorded(started=2, acked=2, failed=1)
    assert set(Delivery.objects.values_list("id", "started")) == {
        (first.delivery_id, True),
        (second.delivery_id, True),
    }
    with django_assert_num_queries(1):
        assert deliveries.record([], [], []) == Recorded(0, 0, 0)
    with django_assert_num_queries(1):
        assert deliveries.record([first], [], []) == Recorded(0, 0, 0)


def test_a_mark_needs_one_lease_per_delivery(make_queue, claim, sql, raises_sql):
    make_queue("#")
    pgmb.send("k", 1)
    [row] = claim()
    with raises_sql("22023", "one lease id per delivery id (1 delivery ids, 0 lease ids)"):
        sql("SELECT pgmb.start(ARRAY[%s]::bigint[], '{}')", (row.delivery_id,))
    with raises_sql("22023", "(0 delivery ids, 1 lease ids)"):
        sql("SELECT pgmb.start(NULL, ARRAY[%s]::uuid[])", (row.lease_id,))
    assert Delivery.objects.get().started is False
