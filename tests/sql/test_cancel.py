"""Cancel and run now: pgmb.cancel and pgmb.run_now in SQL and their typed calls in
pgmb.deliveries (docs/decisions/0084-cancel-and-run-now.md).

A live delivery that is not leased is deleted by a cancel and recorded 'canceled'; a
leased one is marked, and whatever its request's outcome is (ack, failure, release, an
expired lease) is recorded 'canceled' and deletes it: never retried, never dead-lettered.
"""

import uuid
from datetime import timedelta

import pytest

import pgmb
from pgmb import deliveries
from pgmb.deliveries import Canceled, Failure, MadeDue, Success
from pgmb.models import Attempt, DeadLetter, Delivery


def history(message_id) -> list[tuple[int, str, int | None]]:
    return list(
        Attempt.objects.filter(message_id=message_id)
        .order_by("id")
        .values_list("attempt", "outcome", "status_code")
    )


def delivery_of(message_id) -> Delivery:
    return Delivery.objects.get(message_id=message_id)


def test_cancel_deletes_ready_delayed_and_retrying_deliveries(make_queue, sql):
    make_queue("order.*", name="orders")
    ready = pgmb.send("order.a", {"n": 1})
    delayed = pgmb.send("order.b", {"n": 2}, delay=3600)
    retrying = pgmb.send("order.c", {"n": 3})
    claims = deliveries.claim(["orders"], 10)
    [claim] = [c for c in claims if c.message_id == str(retrying)]
    deliveries.release([c for c in claims if c is not claim])
    deliveries.fail([Failure(claim.delivery_id, claim.lease_id, 500, "down")])
    ids = [delivery_of(m).pk for m in (ready, delayed, retrying)]

    [(removed, in_flight)] = sql("SELECT * FROM pgmb.cancel(%s::bigint[])", (ids,))

    assert (removed, in_flight) == (3, 0)
    assert not Delivery.objects.exists()
    assert not DeadLetter.objects.exists()
    assert history(ready) == [(1, "canceled", None)]
    assert history(delayed) == [(1, "canceled", None)]
    # The next attempt's number: the one it would have had.
    assert history(retrying) == [(1, "retry", 500), (2, "canceled", None)]
    errors = set(Attempt.objects.filter(outcome="canceled").values_list("error", flat=True))
    assert errors == {"canceled while ready"}


def test_cancel_twice_or_unknown_or_finished_changes_nothing(make_queue):
    make_queue("order.*", name="orders")
    pgmb.send("order.b", {"n": 2})
    [claim] = deliveries.claim(["orders"], 10)
    deliveries.ack([Success(claim.delivery_id, 200)])
    message_id = pgmb.send("order.a", {"n": 1})
    target = delivery_of(message_id).pk

    assert deliveries.cancel(target) == Canceled(removed=1, in_flight=0)
    before = Attempt.objects.count()
    assert deliveries.cancel([target, claim.delivery_id, 987654321]) == Canceled(0, 0)
    assert deliveries.cancel([]).total == 0
    assert Attempt.objects.count() == before


def test_cancelling_a_group_head_or_a_dependency_releases_those_behind(make_queue):
    make_queue("order.*", name="orders")
    head = pgmb.send("order.a", {"n": 1}, group="g")
    behind = pgmb.send("order.b", {"n": 2}, group="g")
    dependency = pgmb.send("order.c", {"n": 3})
    dependent = pgmb.send("order.d", {"n": 4}, depends_on=[dependency])
    assert delivery_of(behind).state == "waiting"
    assert delivery_of(dependent).state == "waiting"

    assert deliveries.cancel([delivery_of(head).pk, delivery_of(dependency).pk]).removed == 2

    assert delivery_of(behind).state == "ready"
    assert delivery_of(dependent).state == "ready"


def test_cancel_a_waiting_delivery(make_queue):
    make_queue("order.*", name="orders")
    pgmb.send("order.a", {"n": 1}, group="g")
    behind = pgmb.send("order.b", {"n": 2}, group="g")

    assert deliveries.cancel(delivery_of(behind).pk) == Canceled(1, 0)

    assert history(behind) == [(1, "canceled", None)]
    assert Attempt.objects.get(message_id=behind).error == "canceled while waiting"


@pytest.mark.parametrize("status", [200, 500])
def test_a_leased_delivery_is_marked_and_its_outcome_deletes_it(make_queue, status):
    make_queue("order.*", name="orders", max_retries=5)
    message_id = pgmb.send("order.a", {"n": 1})
    [claim] = deliveries.claim(["orders"], 10)
    deliveries.start([claim])

    assert deliveries.cancel(claim.delivery_id) == Canceled(removed=0, in_flight=1)
    assert delivery_of(message_id).canceled_at is not None
    # Twice: already marked, nothing changes.
    assert deliveries.cancel(claim.delivery_id) == Canceled(0, 0)

    if status == 200:
        assert deliveries.ack([Success(claim.delivery_id, 200, 3.0)]) == 1
    else:
        assert deliveries.fail([Failure(claim.delivery_id, claim.lease_id, 500, "boom")]) == 1

    assert not Delivery.objects.exists()
    assert not DeadLetter.objects.exists()
    [row] = Attempt.objects.filter(message_id=message_id)
    assert (row.attempt, row.outcome, row.status_code) == (1, "canceled", status)
    assert row.error.startswith("canceled while its request was in flight")
    if status == 500:
        assert row.error.endswith("boom")


def test_a_cancelled_last_attempt_is_not_dead_lettered(make_queue):
    make_queue("order.*", name="orders", max_retries=0)
    message_id = pgmb.send("order.a", {"n": 1})
    [claim] = deliveries.claim(["orders"], 10)
    deliveries.cancel(claim.delivery_id)

    deliveries.fail([Failure(claim.delivery_id, claim.lease_id, 500, "boom")])

    assert not DeadLetter.objects.exists()
    assert history(message_id) == [(1, "canceled", 500)]


def test_a_cancelled_lease_released_or_expired_is_deleted(make_queue, sql):
    make_queue("order.*", name="orders")
    released = pgmb.send("order.a", {"n": 1})
    expired = pgmb.send("order.b", {"n": 2})
    claims = {uuid.UUID(c.message_id): c for c in deliveries.claim(["orders"], 10)}
    deliveries.cancel([c.delivery_id for c in claims.values()])

    assert deliveries.release([claims[released]]) == 1
    # Never started: an ordinary lease would be handed back ('unsent').
    sql("UPDATE pgmb_delivery SET available_at = now() - interval '1 second'")
    assert deliveries.reclaim_expired() == 1

    assert not Delivery.objects.exists()
    assert not DeadLetter.objects.exists()
    assert history(released) == [(1, "canceled", None)]
    assert history(expired) == [(1, "canceled", None)]


def test_an_ordinary_lease_is_unchanged(make_queue):
    """The outcome writers' other paths, beside a cancelled row in the same call."""
    make_queue("order.*", name="orders", max_retries=3)
    ok, failing, canceled = (pgmb.send("order.a", {"n": n}) for n in range(3))
    claims = {uuid.UUID(c.message_id): c for c in deliveries.claim(["orders"], 10)}
    deliveries.cancel(claims[canceled].delivery_id)

    deliveries.record(
        [],
        [Success(claims[ok].delivery_id, 200)],
        [
            Failure(claims[failing].delivery_id, claims[failing].lease_id, 503, "busy"),
            Failure(claims[canceled].delivery_id, claims[canceled].lease_id, 503, "busy"),
        ],
    )

    assert history(ok) == [(1, "ack", 200)]
    assert history(failing) == [(1, "retry", 503)]
    assert history(canceled) == [(1, "canceled", 503)]
    assert list(Delivery.objects.values_list("message_id", "state")) == [(failing, "ready")]


def test_cancel_by_filter(make_queue, sql, raises_sql):
    make_queue("#", name="orders")
    make_queue("#", name="other")
    old_a = pgmb.send("order.paid", {"n": 1})
    old_b = pgmb.send("invoice.sent", {"n": 2})
    sql("UPDATE pgmb_delivery SET created_at = now() - interval '2 hours'")
    new_a = pgmb.send("order.new", {"n": 3})

    assert deliveries.cancel_matching("orders", "order.", timedelta(hours=1)) == Canceled(1, 0)
    assert set(
        Delivery.objects.filter(queue__name="orders").values_list("message_id", flat=True)
    ) == {
        old_b,
        new_a,
    }
    [(removed, in_flight)] = sql("SELECT * FROM pgmb.cancel('orders')")
    assert (removed, in_flight) == (2, 0)
    # The other queue keeps all three.
    assert Delivery.objects.filter(queue__name="other").count() == 3
    assert history(old_a)[0][1] == "canceled"

    with raises_sql("42704", "no queue named 'nope'"):
        deliveries.cancel_matching("nope")
    with raises_sql("22023", "older_than must not be negative"):
        deliveries.cancel_matching("other", older_than=timedelta(hours=-1))


def test_run_now(make_queue, sql):
    make_queue("order.*", name="orders", backoff_base=3600, backoff_max=3600)
    delayed = pgmb.send("order.a", {"n": 1}, delay=3600)
    retrying = pgmb.send("order.b", {"n": 2})
    pgmb.send("order.c", {"n": 3}, delay=3600, group="g")
    behind = pgmb.send("order.d", {"n": 4}, delay=3600, group="g")
    due = pgmb.send("order.e", {"n": 5})
    # The earliest due is claimed first.
    [claim] = deliveries.claim(["orders"], 1)
    assert claim.message_id == str(retrying)
    deliveries.fail([Failure(claim.delivery_id, claim.lease_id, 500, "down")])
    assert deliveries.claim(["orders"], 10) != []  # `due` is leased now
    ids = [delivery_of(m).pk for m in (delayed, retrying, behind, due)]

    [(made_due, waiting)] = sql("SELECT * FROM pgmb.run_now(%s::bigint[])", (ids,))

    assert (made_due, waiting) == (2, 1)
    claimed = {uuid.UUID(c.message_id) for c in deliveries.claim(["orders"], 10)}
    assert claimed == {delayed, retrying}
    assert delivery_of(behind).state == "waiting"
    # Twice: nothing left to hasten.
    assert deliveries.run_now(ids) == MadeDue(0, 0)


def test_run_now_by_filter(make_queue):
    make_queue("#", name="orders")
    a = pgmb.send("order.a", {"n": 1}, delay=3600)
    pgmb.send("invoice.a", {"n": 2}, delay=3600)

    assert deliveries.run_now_matching("orders", "order.") == MadeDue(1, 0)

    assert {uuid.UUID(c.message_id) for c in deliveries.claim(["orders"], 10)} == {a}
