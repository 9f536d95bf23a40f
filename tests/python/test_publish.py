"""pgmb.send and pgmb.send_batch: what they store, how they route, what they refuse."""

import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction

import pgmb
from pgmb.models import Delivery, Message

pytestmark = pytest.mark.django_db


def test_send_stores_and_routes(make_queue):
    orders = make_queue("order.*")
    audit = make_queue("#")
    make_queue("invoice.#")
    mid = pgmb.send("order.created", {"order_id": 1}, headers={"source": "web"})
    message = Message.objects.get(pk=mid)
    assert (message.routing_key, message.body, message.headers) == (
        "order.created",
        {"order_id": 1},
        {"source": "web"},
    )
    assert message.available_at == message.created_at
    assert set(Delivery.objects.filter(message=message).values_list("queue", flat=True)) == {
        orders.pk,
        audit.pk,
    }


def test_send_encodes_django_types_and_takes_an_id():
    mid = uuid.uuid4()
    assert (
        pgmb.send(
            "a",
            {"at": datetime(2026, 1, 1, tzinfo=timezone.utc), "n": Decimal("1.5")},
            message_id=str(mid),
        )
        == mid
    )
    assert Message.objects.get(pk=mid).body == {"at": "2026-01-01T00:00:00Z", "n": "1.5"}


@pytest.mark.parametrize(
    ("delay", "seconds"),
    [(30, 30), (1.5, 1.5), (timedelta(minutes=10), 600), (0, 0)],
)
def test_relative_delays(delay, seconds):
    message = Message.objects.get(pk=pgmb.send("a", 1, delay=delay))
    assert (message.available_at - message.created_at).total_seconds() == pytest.approx(seconds)


def test_absolute_delay_and_past_times(sql):
    [(now,)] = sql("SELECT now()")
    later = now + timedelta(hours=2)
    assert Message.objects.get(pk=pgmb.send("a", 1, delay=later)).available_at == later
    past = Message.objects.get(pk=pgmb.send("a", 1, delay=now - timedelta(days=1)))
    assert past.available_at == past.created_at


def test_delayed_deliveries_are_not_due(make_queue, sql):
    queue = make_queue("#")
    pgmb.send("a", 1, delay=3600)
    pgmb.send("a", 2)
    [(due,)] = sql(
        "SELECT count(*) FROM pgmb_delivery WHERE queue_id = %s AND available_at <= now()",
        (queue.pk,),
    )
    assert due == 1


def test_send_batch_mixed_items_in_order(make_queue):
    queue = make_queue("#")
    given = uuid.uuid4()
    ids = pgmb.send_batch(
        [
            ("a.b", {"n": 1}),
            {"routing_key": "a.c", "body": [2], "headers": {"h": "v"}, "delay": 60},
            pgmb.Outgoing("a.d", "three", message_id=given),
        ]
    )
    assert ids[2] == given
    stored = {m.pk: m for m in Message.objects.all()}
    assert [stored[i].body for i in ids] == [{"n": 1}, [2], "three"]
    assert stored[ids[1]].headers == {"h": "v"}
    assert (stored[ids[1]].available_at - stored[ids[1]].created_at).total_seconds() == 60
    assert queue.deliveries.count() == 3
    assert pgmb.send_batch([]) == []


def test_batch_of_ten_thousand_routes_exactly(make_worker, make_queue, sql):
    worker = make_worker()
    created = make_queue("order.created", worker=worker)
    orders = make_queue("order.*", worker=worker)
    everything = make_queue("#", worker=worker)
    eu = make_queue("order.#.eu", worker=worker)
    none = make_queue("nothing.*", worker=worker)
    keys = ["order.created", "order.paid.eu", "order.created.eu", "user.signup"]
    ids = pgmb.send_batch((keys[n % 4], {"n": n}) for n in range(10_000))
    assert len(ids) == len(set(ids)) == 10_000
    counts = dict(sql("SELECT queue_id, count(*) FROM pgmb_delivery GROUP BY queue_id"))
    assert counts == {created.pk: 2500, orders.pk: 2500, everything.pk: 10_000, eu.pk: 5000}
    assert none.pk not in counts
    [(pairs, distinct)] = sql(
        "SELECT count(*), count(DISTINCT (message_id, queue_id)) FROM pgmb_delivery"
    )
    assert pairs == distinct == 20_000
    [(orphans,)] = sql(
        "SELECT count(*) FROM pgmb_delivery d LEFT JOIN pgmb_message m ON m.id = d.message_id "
        "WHERE m.id IS NULL"
    )
    assert orphans == 0


def test_outbox_rollback_leaves_nothing(make_queue):
    make_queue("#")

    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        pgmb.send("order.created", {"id": 1})
        pgmb.send_batch([("order.created", {"id": 2})])
        raise Boom
    assert not Message.objects.exists()
    assert not Delivery.objects.exists()


def test_send_and_send_batch_are_one_query_each(django_assert_num_queries, make_queue):
    make_queue("#")
    with django_assert_num_queries(1):
        pgmb.send("a", 1)
    with django_assert_num_queries(1):
        pgmb.send_batch([("a", n) for n in range(500)])
    with django_assert_num_queries(0):
        pgmb.send_batch([])


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [
        (lambda: pgmb.send("order.*", 1), pgmb.InvalidRoutingKey, "wildcards"),
        (lambda: pgmb.send("", 1), pgmb.InvalidRoutingKey, "non-empty"),
        (lambda: pgmb.send("a b", 1), pgmb.InvalidRoutingKey, "blanks"),
        (lambda: pgmb.send(None, 1), pgmb.InvalidRoutingKey, "non-empty"),
        (lambda: pgmb.send("a", object()), pgmb.InvalidBody, "cannot be stored as JSON"),
        (lambda: pgmb.send("a", float("nan")), pgmb.InvalidBody, "cannot be stored as JSON"),
        (lambda: pgmb.send("a", 1, headers=[1]), pgmb.InvalidBody, "must be a mapping"),
        (lambda: pgmb.send("a", 1, delay=-1), pgmb.InvalidDelay, "negative"),
        (lambda: pgmb.send("a", 1, delay="soon"), pgmb.InvalidDelay, "seconds"),
        (lambda: pgmb.send("a", 1, delay=datetime(2030, 1, 1)), pgmb.InvalidDelay, "aware"),
        (lambda: pgmb.send("a", 1, message_id="nope"), pgmb.InvalidBody, "not a UUID"),
        (lambda: pgmb.send_batch([("a", 1), ("b*", 2)]), pgmb.InvalidRoutingKey, "wildcards"),
        (lambda: pgmb.send_batch([{"routing_key": "a"}]), pgmb.InvalidBody, "needs 'routing_key'"),
        (
            lambda: pgmb.send_batch([{"routing_key": "a", "body": 1, "x": 2}]),
            pgmb.InvalidBody,
            "'x'",
        ),
        (lambda: pgmb.send_batch(["a"]), pgmb.InvalidBody, "cannot publish str"),
    ],
)
def test_bad_input_is_refused_before_writing(call, error, text):
    with pytest.raises(error, match=text):
        call()
    assert not Message.objects.exists()
    assert issubclass(error, ValueError)


def test_duplicate_ids(make_queue):
    make_queue("#")
    mid = pgmb.send("a", 1)
    with pytest.raises(pgmb.DuplicateMessage, match=str(mid)), transaction.atomic():
        pgmb.send("a", 2, message_id=mid)
    with pytest.raises(pgmb.DuplicateMessage), transaction.atomic():
        pgmb.send_batch([("a", 3), pgmb.Outgoing("a", 4, message_id=mid)])
    assert list(Message.objects.values_list("body", flat=True)) == [1]
    assert Delivery.objects.count() == 1


def test_orm_writes_are_checked_by_the_database(make_worker):
    """ORM calls skip form validation; the database still refuses bad rows."""
    with pytest.raises(IntegrityError, match="routing_key_valid"), transaction.atomic():
        Message.objects.create(routing_key="a.*", body={}, available_at=datetime.now(timezone.utc))
    assert not Message.objects.exists()


def test_unrouted_names_the_messages_no_queue_got(make_queue, django_assert_num_queries):
    make_queue("order.*")
    routed = pgmb.send("order.created", 1)
    lost = pgmb.send("invoice.created", 2)
    batch = pgmb.send_batch([("nothing.here", 3), ("order.paid", 4), ("typo", 5)])
    with django_assert_num_queries(1):
        assert pgmb.unrouted([routed, lost, *batch, uuid.uuid4()]) == [lost, batch[0], batch[2]]
    assert pgmb.unrouted([]) == []
    with pytest.raises(pgmb.InvalidBody):
        pgmb.unrouted(["not-a-uuid"])


def test_sql_unrouted_agrees_with_the_messages_view(make_queue, sql):
    make_queue("a.#")
    [(kept,)] = sql("SELECT pgmb.send(gen_random_uuid(), 'a.b', '1')")
    [(lost,)] = sql("SELECT pgmb.send(gen_random_uuid(), 'b.a', '1')")
    assert sql("SELECT pgmb.unrouted(ARRAY[%s, %s]::uuid[])", (kept, lost)) == [(lost,)]
    assert sql("SELECT id FROM pgmb.messages WHERE NOT routed") == [(lost,)]
