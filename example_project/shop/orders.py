"""The transactional outbox, pgmb style: the order and its message commit together.

``pgmb.send`` writes to ``pgmb_message`` on the same connection, inside the caller's
transaction. If anything in the block fails, the order and the message are both rolled
back; if it commits, both exist, and the broker delivers the message. There is no window
in which a consumer hears of an order that does not exist, or an order is never announced.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from django.db import transaction

import pgmb

from .models import Order


def place_order(customer: str, total: Decimal | str, items: Sequence[str] = ()) -> Order:
    """Create an order and publish ``order.created`` in one transaction."""
    with transaction.atomic():
        order = Order.objects.create(customer=customer, total=Decimal(total), items=list(items))
        announce(order)
    return order


def announce(order: Order) -> None:
    """Publish ``order.created`` for a saved order, in the caller's transaction."""
    pgmb.send(
        "order.created",
        {
            "order_id": order.pk,
            "customer": order.customer,
            "total": order.total,  # a string in JSON, exact (DjangoJSONEncoder)
            "items": order.items,
        },
        headers={"source": "shop"},
        message_id=order.message_id,
    )
