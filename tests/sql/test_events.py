"""Operational events in SQL: pgmb.publish_event, the dead letter's event from
pgmb.settle_failures, pgmb.nack and pgmb.read, the breaker's from its transitions; nothing
when off, never about an event's own delivery; and who may call what."""

from __future__ import annotations

import psycopg
import pytest
from django.utils import timezone

import pgmb
from pgmb import deliveries, events
from pgmb.deliveries import Failure
from pgmb.models import DeadLetter, Delivery, Message, Queue


def event_messages(key: str = "pgmb.") -> list[Message]:
    return list(Message.objects.filter(routing_key__startswith=key).order_by("created_at", "id"))


def pull_queue(name: str, max_retries: int) -> Queue:
    return Queue.objects.create(
        name=name, binding_key="pull.#", worker=None, max_retries=max_retries
    )


def kill_all(queue: str) -> int:
    """Claim and fail every due delivery of ``queue`` (max_retries 0: each dies)."""
    claims = deliveries.claim([queue], 100)
    return deliveries.fail([Failure(c.delivery_id, c.lease_id, 503, "down") for c in claims])


def test_off_by_default_publish_event_does_nothing(sql, make_queue):
    make_queue("pgmb.#", name="events")
    assert events.enabled() is False
    [(stored,)] = sql("SELECT pgmb.publish_event('pgmb.dead_lettered', '{}')")
    assert stored is None
    assert not Message.objects.exists()
    assert not Delivery.objects.exists()


def test_publish_event_refuses_a_key_outside_pgmb(sql, raises_sql, events_on):
    with raises_sql("22023", "pgmb's events are under pgmb."):
        sql("SELECT pgmb.publish_event('order.created', '{}')")
    assert not Message.objects.exists()


def test_a_dead_letter_publishes_its_event_to_a_queue_bound_on_pgmb(make_queue, events_on):
    orders = make_queue("order.*", name="orders", max_retries=0)
    make_queue("pgmb.#", name="events")
    message_id = pgmb.send("order.created", {"n": 1})

    assert kill_all("orders") == 1

    [event] = event_messages()
    assert event.routing_key == "pgmb.dead_lettered"
    assert event.body == {
        "queue": "orders",
        "worker": orders.worker.name,
        "message_id": str(message_id),
        "routing_key": "order.created",
        "attempts": 1,
        "last_status": 503,
        "last_error": "down",
    }
    [live] = Delivery.objects.filter(queue__name="events")
    assert live.message_id == event.id and live.state == "ready"


def test_a_retry_publishes_nothing_and_events_off_publish_nothing(make_queue, sql):
    make_queue("order.*", name="orders", max_retries=0)
    make_queue("retried.*", name="retried", max_retries=3)
    make_queue("pgmb.#", name="events")
    pgmb.send("order.created", {"n": 1})
    pgmb.send("retried.created", {"n": 2})

    assert kill_all("orders") == 1  # events off: dead, unannounced
    sql("SELECT pgmb.set_events(true)")
    assert kill_all("retried") == 1  # on, but retried: nothing to announce

    assert DeadLetter.objects.count() == 1
    assert event_messages() == []


def test_never_recursive_an_events_own_delivery_dying_publishes_nothing(make_queue, events_on):
    make_queue("order.*", name="orders", max_retries=0)
    make_queue("pgmb.#", name="events", max_retries=0)
    pgmb.send("order.created", {"n": 1})
    kill_all("orders")
    assert len(event_messages()) == 1

    assert kill_all("events") == 1  # the event's delivery dies

    assert DeadLetter.objects.filter(queue__name="events").count() == 1
    assert len(event_messages()) == 1


def test_a_pull_queues_nack_and_read_announce_their_dead_letters(make_queue, sql, events_on):
    pull_queue("inbox", 0)
    pull_queue("outbox", 1)
    make_queue("pgmb.#", name="events")
    pgmb.send("pull.one", {"n": 1})

    [(inbox_id, inbox_reads)] = sql("SELECT delivery_id, read_ct FROM pgmb.read('inbox', 30, 1)")
    sql("SELECT pgmb.nack('inbox', %s, %s, %s)", ([inbox_id], [inbox_reads], ["handler raised"]))
    # outbox: read twice without a delete, the third read buries it.
    for _ in range(2):
        sql("SELECT delivery_id FROM pgmb.read('outbox', 0, 1)")
    assert sql("SELECT delivery_id FROM pgmb.read('outbox', 0, 1)") == []

    bodies = {(e.body["queue"], e.body["worker"], e.body["attempts"]) for e in event_messages()}
    assert bodies == {("inbox", None, 1), ("outbox", None, 2)}
    [nacked] = [e for e in event_messages() if e.body["queue"] == "inbox"]
    assert nacked.body["last_error"] == "handler raised"


def test_breaker_opened_and_closed_by_hand_are_events(make_worker, make_queue, sql, events_on):
    worker = make_worker(breaker_failures=1, breaker_cooldown=3600, breaker_cooldown_max=3600)
    make_queue("order.*", name="orders", worker=worker)
    make_queue("pgmb.breaker.*", name="breakers")
    pgmb.send("order.created", {"n": 1})
    [claim] = deliveries.claim(["orders"], 1)
    deliveries.fail([Failure(claim.delivery_id, claim.lease_id, 500, "down")])
    sql("SELECT pgmb.breaker_reset(%s::uuid[])", ([worker.pk],))

    assert [(e.routing_key, e.body) for e in event_messages()] == [
        (
            "pgmb.breaker.opened",
            {"worker": worker.name, "state": "open", "reason": "1 failures in a row (last: down)"},
        ),
        (
            "pgmb.breaker.closed",
            {"worker": worker.name, "state": "closed", "reason": "closed by hand"},
        ),
    ]
    assert Delivery.objects.filter(queue__name="breakers").count() == 2


def test_events_are_switched_by_the_owner_only(login_role, owner):
    _, consumer = login_role("pgmb_consumer")
    _, producer = login_role("pgmb_producer")
    for conn in (consumer, producer):
        for statement in (
            "SELECT pgmb.set_events(true)",
            "SELECT pgmb.publish_event('pgmb.dead_lettered', '{}')",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    assert owner.execute("SELECT pgmb.events_enabled()").fetchone() == (False,)


def test_a_consumer_roles_nack_publishes_the_event_it_may_not_publish_itself(
    transactional_db, make_queue, login_role, owner, events_on
):
    pull_queue("inbox", 0)
    make_queue("pgmb.#", name="events")
    role, consumer = login_role()
    owner.execute("SELECT pgmb.grant_queue_access('inbox', %s)", (role,))
    pgmb.send("pull.one", {"n": 1})

    [(msg_id, reads)] = consumer.execute(
        "SELECT delivery_id, read_ct FROM pgmb.read('inbox', 30, 1)"
    ).fetchall()
    consumer.execute("SELECT pgmb.nack('inbox', %s, %s)", ([msg_id], [reads]))

    [event] = event_messages()
    assert event.routing_key == "pgmb.dead_lettered" and event.body["queue"] == "inbox"
    # Published as nack's owner (a definer): the role itself may not.
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        consumer.execute("SELECT pgmb.publish_event('pgmb.dead_lettered', '{}')")


def test_a_dispatcher_role_in_pgmb_admin_publishes_the_event_of_its_dead_letter(
    transactional_db, make_queue, login_role, owner, events_on
):
    make_queue("order.*", name="orders", max_retries=0)
    make_queue("pgmb.#", name="events")
    message_id = pgmb.send("order.created", {"n": 1})
    _, dispatcher = login_role("pgmb_admin")

    [(delivery_id, lease_id)] = dispatcher.execute(
        "SELECT delivery_id, lease_id FROM pgmb.claim(ARRAY['orders'], 10)"
    ).fetchall()
    dispatcher.execute(
        "SELECT pgmb.fail(ARRAY[%s]::bigint[], ARRAY[%s]::uuid[], ARRAY[500], ARRAY['down'])",
        (delivery_id, lease_id),
    )

    [event] = event_messages()
    assert event.body["message_id"] == str(message_id)
    assert Delivery.objects.filter(queue__name="events", message_id=event.id).exists()


@pytest.mark.parametrize("on_expiry", ["dead_letter", "drop"])
def test_an_expiry_publishes_its_event(make_queue, events_on, on_expiry):
    orders = make_queue("order.*", name="orders", on_expiry=on_expiry)
    make_queue("pgmb.#", name="events")
    past = pgmb.send("order.created", {"n": 1}, expires_at=timezone.now())
    pgmb.send("order.created", {"n": 2}, ttl=3600)

    assert deliveries.expire() == 1

    [event] = event_messages()
    assert event.routing_key == "pgmb.expired"
    assert event.body["queue"] == "orders" and event.body["worker"] == orders.worker.name
    assert event.body["message_id"] == str(past) and event.body["attempts"] == 0
    assert event.body["error"].startswith("expired: its time to live ran out at ")
    assert DeadLetter.objects.filter(queue=orders).count() == (on_expiry == "dead_letter")
