"""The transactional outbox of the example shop: an order and its message commit together
or not at all."""

from decimal import Decimal

import pytest
from django.db import transaction

import pgmb
from pgmb.models import Delivery, Message


def test_an_order_is_created_with_its_routed_message(shop, make_queue):
    from shop.orders import place_order

    queue = make_queue("order.*", name="order_queue")

    order = place_order("Ada", "42.10", ["notebook", "pen"])

    stored = shop.Order.objects.get()
    assert (stored.customer, stored.total, stored.items) == (
        "Ada",
        Decimal("42.10"),
        ["notebook", "pen"],
    )
    message = Message.objects.get()
    assert message.id == order.message_id == stored.message_id
    assert message.routing_key == "order.created"
    assert message.body == {
        "order_id": order.pk,
        "customer": "Ada",
        "total": "42.10",
        "items": ["notebook", "pen"],
    }
    assert message.headers == {"source": "shop"}
    assert list(Delivery.objects.values_list("message_id", "queue_id")) == [(message.id, queue.pk)]


class Boom(Exception):
    pass


def test_a_rolled_back_block_leaves_neither_order_nor_message(shop, make_queue):
    from shop.orders import place_order

    make_queue("order.*", name="order_queue")
    place_order("Ada", "1.00")

    with pytest.raises(Boom), transaction.atomic():
        place_order("Mallory", "9.99", ["refused"])
        assert shop.Order.objects.filter(customer="Mallory").exists()  # visible inside
        raise Boom

    assert list(shop.Order.objects.values_list("customer", flat=True)) == ["Ada"]
    assert Message.objects.count() == 1
    assert Delivery.objects.count() == 1


def test_a_failed_publish_rolls_the_order_back(shop):
    from shop.orders import announce

    taken = pgmb.send("order.created", {"order_id": 0})

    with pytest.raises(pgmb.DuplicateMessage), transaction.atomic():
        order = shop.Order.objects.create(customer="Ada", total=1, message_id=taken)
        announce(order)

    assert not shop.Order.objects.exists()
    assert list(Message.objects.values_list("id", flat=True)) == [taken]
