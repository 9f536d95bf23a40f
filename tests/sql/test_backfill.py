"""Backfill and recover: pgmb.backfill gives a queue made later the older stored messages
its binding matches, once; pgmb.recover requeues a window's dead letters only. Both refuse
bad input with a clear error and change nothing (deliveries.backfill, deliveries.recover)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.utils import timezone

import pgmb
from pgmb import deliveries, fairness
from pgmb.deliveries import Failure, Success
from pgmb.models import Attempt, DeadLetter, Delivery, Message, Queue

HOUR = dt.timedelta(hours=1)


def pairs(queue: str) -> set:
    return set(
        Delivery.objects.filter(queue__name=queue).values_list("message_id", "state", "attempts")
    )


def backdate(queue: Queue, when: dt.datetime) -> None:
    """The queue was made at ``when`` (what auto_now_add would not let a test say)."""
    Queue.objects.filter(pk=queue.pk).update(created_at=when)


def test_backfill_gives_a_later_queue_exactly_the_matching_older_messages_once(make_queue):
    make_queue("order.*", name="orders")
    older = [pgmb.send("order.created", {"n": n}) for n in range(3)]
    pgmb.send("user.created", {"n": 9})  # another key
    late = make_queue("order.created", name="late")
    newer = pgmb.send("order.created", {"n": 4})  # routed to late when published
    start = timezone.now() - HOUR

    assert deliveries.backfill("late", start, timezone.now()) == 3

    assert pairs("late") == {(m, "ready", 0) for m in [*older, newer]}
    # Twice: nothing more. Once delivered, still nothing more.
    assert deliveries.backfill("late", start, timezone.now()) == 0
    claims = deliveries.claim(["late"], 100)
    deliveries.ack([Success(c.delivery_id, 200) for c in claims])
    assert deliveries.backfill("late", start, timezone.now()) == 0
    assert Attempt.objects.filter(queue=late, outcome="ack").count() == 4


def test_backfill_keeps_to_its_window_and_its_limit_then_goes_on(make_queue, sql):
    make_queue("order.*", name="orders")
    ids = [pgmb.send("order.created", {"n": n}) for n in range(5)]
    # The first message an hour older than the rest; the rest a second apart (sent in the
    # test's one transaction, they would share its time, and ids of one millisecond are in
    # no particular order).
    Message.objects.filter(pk=ids[0]).update(created_at=timezone.now() - 2 * HOUR)
    for n, message_id in enumerate(ids[1:]):
        sent_at = timezone.now() - HOUR / 2 + n * dt.timedelta(seconds=1)
        Message.objects.filter(pk=message_id).update(created_at=sent_at)
    make_queue("order.*", name="late")
    since = timezone.now() - HOUR

    [(n,)] = sql("SELECT pgmb.backfill('late', %s, %s, max_count => 2)", (since, timezone.now()))
    assert n == 2
    assert {m for m, _, _ in pairs("late")} == set(ids[1:3])  # oldest first
    assert deliveries.backfill("late", since, timezone.now()) == 2
    assert deliveries.backfill("late", since, timezone.now()) == 0
    assert {m for m, _, _ in pairs("late")} == set(ids[1:])


def test_backfill_skips_what_the_queue_had_dead_or_delivered(make_queue):
    queue = make_queue("order.*", name="orders", max_retries=0)
    dead, acked, live = (pgmb.send("order.created", {"n": n}) for n in range(3))
    for claim in deliveries.claim(["orders"], 100):
        if claim.message_id == str(acked):
            deliveries.ack([Success(claim.delivery_id, 200)])
        elif claim.message_id == str(dead):
            deliveries.fail([Failure(claim.delivery_id, claim.lease_id, 500, "down")])
        else:
            deliveries.release([claim])
    backdate(queue, timezone.now() + HOUR)  # as if made after all three

    assert deliveries.backfill("orders", timezone.now() - HOUR, timezone.now()) == 0
    assert pairs("orders") == {(live, "ready", 0)}
    assert DeadLetter.objects.filter(message_id=dead).count() == 1


@pytest.mark.parametrize(
    ("args", "sqlstate", "match"),
    [
        (("nope", "-1 hour", "0"), "42704", "queue 'nope' does not exist"),
        (("late", "0", "-1 hour"), "22023", "invalid window for backfill: until"),
        (("late", None, "0"), "22023", "since and until are both needed"),
        (("late", "-1 hour", None), "22023", "since and until are both needed"),
    ],
)
def test_backfill_refuses_bad_input_and_changes_nothing(
    make_queue, sql, raises_sql, args, sqlstate, match
):
    make_queue("order.*", name="orders")
    pgmb.send("order.created", {"n": 1})
    make_queue("order.*", name="late")
    before = set(Delivery.objects.values_list("message_id", "queue_id"))
    queue, since, until = args

    with raises_sql(sqlstate, match):
        sql(
            "SELECT pgmb.backfill(%s, now() + %s::interval, now() + %s::interval)",
            (queue, since, until),
        )

    assert set(Delivery.objects.values_list("message_id", "queue_id")) == before


def test_backfill_refuses_a_max_count_out_of_range_and_a_queue_without_history(
    make_queue, raises_sql
):
    make_queue("order.*", name="late")
    Queue.objects.create(name="inbox", binding_key="pull.*", worker=None, keep_history=False)
    since = timezone.now() - HOUR
    with raises_sql("22023", "invalid max_count 0 for backfill"):
        deliveries.backfill("late", since, timezone.now(), 0)
    with raises_sql("55000", "queue 'inbox' keeps no history"):
        deliveries.backfill("inbox", since, timezone.now())


def _dead_letters(queue, ages_hours: list[float]) -> list[DeadLetter]:
    made = []
    for n, age in enumerate(ages_hours):
        message_id = pgmb.send("order.created", {"n": n})
        Delivery.objects.filter(message_id=message_id, queue=queue).delete()
        made.append(
            DeadLetter.objects.create(
                message_id=message_id,
                queue=queue,
                attempts=1,
                last_status=500,
                created_at=timezone.now() - dt.timedelta(hours=age),
            )
        )
    return made


def test_recover_requeues_the_windows_dead_letters_only(make_queue):
    orders = make_queue("order.*", name="orders")
    other = make_queue("nothing", name="other")
    old, recent, newest = _dead_letters(orders, [5, 1.5, 0.5])
    [elsewhere] = _dead_letters(other, [1.5])
    Delivery.objects.all().delete()

    assert deliveries.recover("orders", timezone.now() - 2 * HOUR, timezone.now() - HOUR) == 1

    assert pairs("orders") == {(recent.message_id, "ready", 0)}
    assert set(DeadLetter.objects.values_list("pk", flat=True)) == {
        old.pk,
        newest.pk,
        elsewhere.pk,
    }
    # Again: nothing more. Without an end: up to now.
    assert deliveries.recover("orders", timezone.now() - 2 * HOUR, timezone.now() - HOUR) == 0
    assert deliveries.recover("orders", timezone.now() - 2 * HOUR) == 1
    assert {m for m, _, _ in pairs("orders")} == {recent.message_id, newest.message_id}


def test_recover_refuses_bad_input_and_changes_nothing(make_queue, raises_sql):
    orders = make_queue("order.*", name="orders")
    _dead_letters(orders, [1])
    before = set(DeadLetter.objects.values_list("pk", flat=True))
    now = timezone.now()
    with raises_sql("42704", "queue 'nope' does not exist"):
        deliveries.recover("nope", now - HOUR)
    with raises_sql("22023", "invalid window for recover: until"):
        deliveries.recover("orders", now, now - HOUR)
    with raises_sql("22023", "invalid max_count 2000000 for recover"):
        deliveries.recover("orders", now - HOUR, now, 2_000_000)
    assert set(DeadLetter.objects.values_list("pk", flat=True)) == before
    assert connection.is_usable()


def test_backfill_makes_deliveries_as_routing_would(make_queue, sql):
    make_queue("order.*", name="orders")
    acme = pgmb.send("order.created", {"n": 1}, headers={"tenant": "acme"})
    gone = pgmb.send("order.created", {"n": 2}, expires_at=timezone.now())
    late = make_queue("order.*", name="late", message_ttl=1)
    fairness.set_header("late", "tenant")

    assert deliveries.backfill("late", timezone.now() - HOUR, timezone.now()) == 2

    rows = sql("SELECT message_id, fair_key FROM pgmb_delivery WHERE queue_id = %s", (late.pk,))
    assert dict(rows) == {acme: "acme", gone: ""}
    # The message's own expiry, not the queue's TTL counted from a publication long past.
    assert Delivery.objects.get(queue=late, message_id=acme).expires_at is None
    assert deliveries.expire() == 2  # on both queues
    assert DeadLetter.objects.get(queue=late).message_id == gone
