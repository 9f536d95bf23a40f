"""manage.py pgmb_deliveries against a real PostgreSQL: what it cancels, makes due now and
refuses."""

from __future__ import annotations

import io
import uuid

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import pgmb
from pgmb import deliveries
from pgmb.models import Attempt, Delivery


def run(*args, **options) -> str:
    out = io.StringIO()
    call_command("pgmb_deliveries", *args, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()


def fails(*args, match: str) -> str:
    with pytest.raises(CommandError) as info:
        run(*args)
    message = str(info.value)
    assert match in message, message
    assert "\n" not in message
    return message


def live() -> set[uuid.UUID]:
    return set(Delivery.objects.values_list("message_id", flat=True))


@pytest.fixture
def orders(make_queue):
    make_queue("#", name="order_queue")
    return [
        pgmb.send(key, {"n": n}, delay=3600)
        for n, key in enumerate(["order.a", "order.b", "test.c"])
    ]


def test_cancel_by_id_and_message_id(orders):
    first = Delivery.objects.get(message_id=orders[0]).pk

    out = run("cancel", "order_queue", "--id", str(first), str(orders[1]))

    assert out.strip() == "cancelled 2 deliveries of queue order_queue"
    assert live() == {orders[2]}
    assert set(Attempt.objects.values_list("message_id", "outcome")) == {
        (orders[0], "canceled"),
        (orders[1], "canceled"),
    }


def test_ids_that_are_not_live_are_refused_and_nothing_changes(orders):
    first = Delivery.objects.get(message_id=orders[0]).pk
    deliveries.cancel(first)

    fails(
        "cancel",
        "order_queue",
        "--id",
        str(first),
        match="not a live delivery of queue order_queue (unknown, finished or already "
        f"cancelled): {first}; nothing changed",
    )
    fails(
        "run-now", "order_queue", "--id", str(orders[1]), "999999", match="999999; nothing changed"
    )
    fails("cancel", "nope", "--all", match="no queue named 'nope'")
    fails("cancel", "order_queue", match="say which deliveries")
    fails("cancel", "order_queue", "--all", "--routing-key-prefix", "order.", match="say which")
    assert live() == {orders[1], orders[2]}
    assert (
        Delivery.objects.get(message_id=orders[1]).available_at
        > Delivery.objects.get(message_id=orders[1]).created_at
    )


def test_cancel_in_flight_says_so(orders):
    deliveries.run_now_matching("order_queue")
    claims = deliveries.claim(["order_queue"], 1)

    out = run("cancel", "order_queue", "--id", str(claims[0].delivery_id))

    assert "cancelled 1 delivery of queue order_queue (1 in flight" in out
    assert Delivery.objects.get(pk=claims[0].delivery_id).canceled_at is not None


def test_cancel_by_prefix_and_age(orders, sql):
    sql(
        "UPDATE pgmb_delivery SET created_at = now() - interval '2 days' WHERE message_id = %s",
        (orders[0],),
    )

    assert "cancelled 1 delivery" in run(
        "cancel", "order_queue", "--routing-key-prefix", "order.", "--older-than", "1d"
    )
    assert live() == {orders[1], orders[2]}
    assert "cancelled 0 deliveries" in run("cancel", "order_queue", "--older-than", "1d")


def test_run_now_and_dry_run(orders):
    out = run("run-now", "order_queue", "--all", "--dry-run")
    assert (
        out.strip()
        == "would have made 3 deliveries of queue order_queue due now (dry run: nothing changed)"
    )
    assert deliveries.claim(["order_queue"], 10) == []

    assert "made 2 deliveries" in run("run-now", "order_queue", "--routing-key-prefix", "order.")

    assert {uuid.UUID(c.message_id) for c in deliveries.claim(["order_queue"], 10)} == set(
        orders[:2]
    )


def test_bad_age_is_one_line(orders):
    fails("cancel", "order_queue", "--older-than", "-5", match="--older-than")
