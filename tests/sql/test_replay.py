"""Replaying delivered messages: pgmb.replay in SQL and deliveries.replay, its typed call.

A replay creates a new ready delivery (due now, attempts 0) of each message on each queue
that acknowledged it, skips queues where the message is live or dead right now, and
returns how many it created."""

import uuid

import pgmb
from pgmb import deliveries
from pgmb.deliveries import Failure, Success
from pgmb.models import Attempt, DeadLetter, Delivery


def deliver_all(queues=None) -> None:
    """Claim and ack every due delivery (of ``queues``)."""
    claims = deliveries.claim(queues, 100)
    deliveries.ack([Success(c.delivery_id, 200, 1.0) for c in claims])


def live() -> set[tuple[uuid.UUID, str, str, int]]:
    return {
        (d.message_id, d.queue.name, d.state, d.attempts)
        for d in Delivery.objects.select_related("queue")
    }


def test_replay_in_sql_recreates_deliveries_on_every_queue_that_acked(make_queue, sql):
    make_queue("order.*", name="orders")
    make_queue("order.#", name="audit")
    make_queue("other.*", name="other")
    first = pgmb.send("order.created", {"n": 1})
    second = pgmb.send("order.paid", {"n": 2})
    deliver_all()
    assert not Delivery.objects.exists()

    [(n,)] = sql("SELECT pgmb.replay(%s::uuid[])", ([first, second],))

    assert n == 4
    assert live() == {
        (first, "orders", "ready", 0),
        (first, "audit", "ready", 0),
        (second, "orders", "ready", 0),
        (second, "audit", "ready", 0),
    }
    [(due,)] = sql("SELECT bool_and(available_at <= now()) FROM pgmb_delivery")
    assert due
    # Delivered again, the history gains a second ack per queue.
    claims = deliveries.claim(None, 100)
    assert {(c.queue, c.attempt) for c in claims} == {("orders", 1), ("audit", 1)}
    deliveries.ack([Success(c.delivery_id, 200) for c in claims])
    assert Attempt.objects.filter(message_id=first, outcome="ack").count() == 4


def test_replay_restricted_to_named_queues(make_queue):
    make_queue("order.*", name="orders")
    make_queue("order.#", name="audit")
    message_id = pgmb.send("order.created", {"n": 1})
    deliver_all()

    assert deliveries.replay([message_id], queues=["audit", "nope"]) == 1

    assert live() == {(message_id, "audit", "ready", 0)}


def test_replay_skips_queues_where_the_message_is_live_or_dead(make_queue):
    make_queue("order.*", name="orders")
    make_queue("order.#", name="audit", max_retries=0)
    make_queue("order.created", name="late")
    message_id = pgmb.send("order.created", {"n": 1})
    deliver_all(["orders", "audit", "late"])
    # Live again on orders (a first replay, not delivered yet); dead on audit.
    assert deliveries.replay(message_id, queues=["orders", "audit"]) == 2
    [claim] = deliveries.claim(["audit"], 10)
    deliveries.fail([Failure(claim.delivery_id, claim.lease_id, 500, "down")])
    assert DeadLetter.objects.filter(message_id=message_id, queue__name="audit").exists()

    assert deliveries.replay(str(message_id)) == 1  # only "late"

    assert live() == {(message_id, "orders", "ready", 0), (message_id, "late", "ready", 0)}


def test_replay_only_where_acked(make_queue):
    make_queue("order.*", name="orders")
    make_queue("order.#", name="audit", max_retries=0)
    message_id = pgmb.send("order.created", {"n": 1})
    deliver_all(["orders"])
    [claim] = deliveries.claim(["audit"], 10)
    deliveries.fail([Failure(claim.delivery_id, claim.lease_id, 500, "down")])
    deliveries.purge_dead_letters(DeadLetter.objects.values_list("pk", flat=True))

    assert deliveries.replay([message_id]) == 1  # audit never acked it

    assert live() == {(message_id, "orders", "ready", 0)}


def test_replay_of_unknown_or_undelivered_messages_creates_nothing(make_queue, sql):
    make_queue("order.*", name="orders")
    pending = pgmb.send("order.created", {"n": 1})  # never delivered: nothing acked it

    assert deliveries.replay([uuid.uuid4(), uuid.uuid4()]) == 0
    assert deliveries.replay([pending]) == 0
    assert deliveries.replay([]) == 0
    assert sql("SELECT pgmb.replay('{}')") == [(0,)]
    assert live() == {(pending, "orders", "ready", 0)}


def test_replay_call_is_one_statement_with_typed_parameters():
    message_id = uuid.uuid4()
    call = deliveries.replay_call([str(message_id)], ("orders",))
    assert "pgmb.replay(" in call.query
    assert call.params == {"ids": [message_id], "queues": ["orders"]}
    assert call.read(["replay"], [(3,)]) == 3
    assert deliveries.replay_call(message_id).params == {"ids": [message_id], "queues": None}
