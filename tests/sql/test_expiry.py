"""Expiry in the state machine (pgmb/sql/schema/deliveries.sql, pull.sql): claims and reads
never hand out an expired delivery, pgmb.expire settles the unposted ones only, and what
it settled is counted as "expired (TTL)", not as a failed attempt. A delivery's time is
moved into the past by an UPDATE where a test needs a time to pass between two steps."""

from __future__ import annotations

import datetime
import uuid

import pytest

import pgmb
from pgmb import dashboard_series, deliveries, metrics, pull
from pgmb.deliveries import Failure, Success
from pgmb.models import Attempt, DeadLetter, Delivery, Queue

PAST = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)

pytestmark = pytest.mark.django_db


def _pass_expiry(sql) -> None:
    sql(
        "UPDATE pgmb_delivery SET expires_at = clock_timestamp() - interval '1 second'"
        " WHERE expires_at IS NOT NULL"
    )


def test_a_claim_leaves_expired_deliveries_without_a_sweep(make_queue):
    queue = make_queue("exp.*")
    gone = pgmb.send("exp.a", {"n": 1}, expires_at=PAST)
    kept = pgmb.send("exp.b", {"n": 2}, ttl=3600)
    [row] = deliveries.claim()
    assert row.message_id == str(kept)
    assert Delivery.objects.get(message_id=gone).state == "ready"  # until pgmb.expire
    assert deliveries.expire() == 1
    letter = DeadLetter.objects.get(message_id=gone)
    assert (letter.queue_id, letter.attempts) == (queue.id, 0)
    assert letter.last_error.startswith("expired: its time to live ran out at ")
    assert deliveries.expire() == 0


def test_the_earlier_of_the_message_and_the_queue_expiry(make_queue, sql):
    make_queue("exp.#", message_ttl=60)
    near = pgmb.send("exp.a", {}, ttl=5)
    far = pgmb.send("exp.a", {}, ttl=3600)
    none = pgmb.send("exp.a", {})
    rows = dict(
        sql(
            "SELECT d.message_id, d.expires_at - m.created_at FROM pgmb_delivery d"
            " JOIN pgmb_message m ON m.id = d.message_id"
        )
    )
    assert rows[near] == datetime.timedelta(seconds=5)
    assert rows[far] == rows[none] == datetime.timedelta(seconds=60)


def test_no_expiry_stores_none(make_queue, sql):
    make_queue("exp.#")
    pgmb.send("exp.a", {})
    pgmb.send_batch([("exp.a", {}), {"routing_key": "exp.a", "body": {}, "ttl": 9}])
    assert sorted(sql("SELECT expires_at IS NULL FROM pgmb_delivery")) == [
        (False,),
        (True,),
        (True,),
    ]


def test_a_leased_delivery_is_left_to_its_outcome(make_queue, sql):
    """Only unposted deliveries expire: one whose TTL passes during its request is acked,
    or, failed, expires instead of being posted again."""
    make_queue("exp.#", max_retries=3)
    pgmb.send("exp.a", {"n": 1}, ttl=3600)
    pgmb.send("exp.b", {"n": 2}, ttl=3600)
    rows = deliveries.claim()
    assert len(rows) == 2
    _pass_expiry(sql)
    assert deliveries.expire() == 0
    acked, failed = rows
    assert deliveries.ack([Success(acked.delivery_id, 200, 1.0)]) == 1
    assert deliveries.fail([Failure(failed.delivery_id, failed.lease_id, 500, "boom")]) == 1
    assert deliveries.claim() == []
    assert deliveries.expire() == 1
    assert not Delivery.objects.exists()
    outcomes = sorted(Attempt.objects.values_list("outcome", flat=True))
    assert outcomes == ["ack", "retry", "ttl"]
    letter = DeadLetter.objects.get()
    assert (letter.attempts, letter.last_status) == (1, 500)


def test_dropped_on_expiry_leaves_only_its_history(make_queue):
    make_queue("exp.#", on_expiry="drop")
    mid = pgmb.send("exp.a", {}, expires_at=PAST)
    assert deliveries.expire() == 1
    assert not Delivery.objects.exists() and not DeadLetter.objects.exists()
    [row] = Attempt.objects.filter(message_id=mid)
    assert (row.outcome, row.attempt, row.status_code) == ("ttl", 0, None)
    assert row.error.startswith("expired: ")


@pytest.mark.parametrize(("on_expiry", "released"), [("drop", True), ("dead_letter", False)])
def test_an_expired_dependency_releases_as_a_delete_or_a_dead_letter_does(
    make_queue, on_expiry, released
):
    make_queue("exp.#", on_expiry=on_expiry)
    first = pgmb.send("exp.a", {}, expires_at=PAST)
    second = pgmb.send("exp.b", {}, depends_on=[first])
    assert Delivery.objects.get(message_id=second).state == "waiting"
    assert deliveries.expire() == 1
    state = Delivery.objects.get(message_id=second).state
    assert state == ("ready" if released else "waiting")


def test_a_waiting_delivery_expires_too(make_queue):
    make_queue("exp.#")
    first = pgmb.send("exp.a", {}, group="g")
    second = pgmb.send("exp.a", {}, group="g", expires_at=PAST)
    assert Delivery.objects.get(message_id=second).state == "waiting"
    assert deliveries.expire() == 1
    assert DeadLetter.objects.get().message_id == second
    assert list(Delivery.objects.values_list("message_id", flat=True)) == [first]


def test_a_pull_queue_reads_no_expired_message(db, sql):
    Queue.objects.create(name="pulled", binding_key="exp.#", worker=None)
    pgmb.send("exp.a", {"n": "gone"}, expires_at=PAST)
    kept = pgmb.send("exp.a", {"n": "kept"}, ttl=3600)
    [read] = pull.read("pulled", vt=30, qty=10)
    assert str(read.message_id) == str(kept)
    # Read and invisible: not expired until it is visible again.
    _pass_expiry(sql)
    assert deliveries.expire() == 1  # the unread one
    assert Delivery.objects.filter(message_id=kept).exists()
    sql("UPDATE pgmb_delivery SET available_at = clock_timestamp() - interval '1 second'")
    assert pull.read("pulled", vt=30, qty=10) == []
    assert deliveries.expire() == 1
    assert not Delivery.objects.exists()


def test_expirations_are_counted_as_such_not_as_failures(make_queue):
    queue = make_queue("exp.#")
    for _ in range(3):
        pgmb.send("exp.a", {}, expires_at=PAST)
    assert deliveries.expire() == 3
    points = dashboard_series.series(dashboard_series.LIVE, queue=queue.name)
    assert sum(p.expired_ttl for p in points) == 3
    assert sum(p.failed for p in points) == 0
    assert points[-1].depth == 0
    figures = metrics.queue(queue.name)
    assert figures.failed_last_hour == 0
    assert figures.dead_letters == 3


def test_the_sql_overload(make_queue, sql):
    make_queue("exp.#")
    mid = uuid.uuid4()
    sql(
        "SELECT pgmb.send(%s, 'exp.a', '{}'::jsonb, NULL, NULL, ttl => 30, priority => 2)",
        (mid,),
    )
    [(ttl, priority)] = sql(
        "SELECT extract(epoch FROM d.expires_at - m.created_at), d.priority"
        " FROM pgmb_delivery d JOIN pgmb_message m ON m.id = d.message_id"
    )
    assert (ttl, priority) == (30, 2)
    # The released form with a positional priority still reaches the released function.
    other = uuid.uuid4()
    sql("SELECT pgmb.send(%s, 'exp.a', '{}'::jsonb, NULL, NULL, 5)", (other,))
    assert sql(
        "SELECT priority, expires_at FROM pgmb_delivery WHERE message_id = %s", (other,)
    ) == [(5, None)]


def test_a_queue_refuses_a_bad_ttl_or_expiry_action(make_queue, sql, raises_sql):
    queue = make_queue("exp.#")
    for column, value in (("message_ttl", "0"), ("message_ttl", "-1"), ("on_expiry", "'keep'")):
        with raises_sql("23514"):
            sql(f"UPDATE pgmb_queue SET {column} = {value} WHERE id = %s", (queue.id,))
