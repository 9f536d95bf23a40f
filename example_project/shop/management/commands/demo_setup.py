"""``manage.py demo_setup``: the demo's workers and queues, and some traffic.

Idempotent: workers and queues are created or brought back to the demo's settings, so it
can run again (with another ``--port``, for instance). Each run publishes new messages
unless ``--no-publish`` is given.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connection, models, transaction

import pgmb
from pgmb.models import Message, Queue, Worker
from shop.models import Order
from shop.orders import place_order

ORDERS = [
    ("Ada", "42.00", ["notebook", "pen"]),
    ("Grace", "17.50", ["compiler manual"]),
    ("Linus", "99.90", ["keyboard"]),
]


class _Rollback(Exception):
    pass


class Command(BaseCommand):
    help = "Register the demo workers and queues, then publish a few messages."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--port", type=int, default=8000, help="Port of the example site (default 8000)."
        )
        parser.add_argument(
            "--host", default="127.0.0.1", help="Host of the example site (default 127.0.0.1)."
        )
        parser.add_argument(
            "--no-publish", action="store_true", help="Only register workers and queues."
        )

    def handle(self, *args: Any, port: int, host: str, no_publish: bool, **options: Any) -> None:
        site = f"http://{host}:{port}"
        with transaction.atomic():
            demo = self._ensure(
                Worker,
                "demo_worker",
                endpoint=f"{site}/worker/orders/",
                rps=5,
                timeout=5.0,
                active=True,
            )
            flaky = self._ensure(
                Worker,
                "flaky_worker",
                endpoint=f"{site}/worker/flaky/",
                rps=2,
                timeout=5.0,
                active=True,
            )
            self._ensure(Queue, "order_queue", binding_key="order.*", worker=demo)
            # Not "#": a fanout would route every message, and the demo shows an unrouted
            # one. "order.#" also gets order.shipped.eu, which "order.*" does not.
            self._ensure(Queue, "audit_queue", binding_key="order.#", worker=demo)
            self._ensure(
                Queue,
                "flaky_queue",
                binding_key="order.created",
                worker=flaky,
                max_retries=2,
                backoff_base=1.0,
                backoff_max=10.0,
                paused=False,
            )
        if not no_publish:
            self._publish()
        self._summary()

    def _ensure(self, model: type[models.Model], name: str, **values: Any) -> Any:
        """Create the row named ``name`` or bring it back to ``values``; say which."""
        obj = model.objects.filter(name=name).first()
        if obj is None:
            obj, what = model(name=name, **values), "created"
        else:
            changed = [k for k, v in values.items() if getattr(obj, k) != v]
            for key in changed:
                setattr(obj, key, values[key])
            what = f"updated ({', '.join(changed)})" if changed else "unchanged"
        if what != "unchanged":
            obj.full_clean()
            obj.save()
        kind = model._meta.verbose_name
        detail = obj.endpoint if model is Worker else f"{obj.binding_key} → {obj.worker.name}"
        self.stdout.write(f"{kind} {name}: {what} [{detail}]")
        return obj

    def _publish(self) -> None:
        for customer, total, items in ORDERS:
            order = place_order(customer, total, items)
            self.stdout.write(
                f"outbox: order {order.pk} ({customer}, {total}) and its order.created "
                f"message {order.message_id} committed together"
            )
        # A failing block: the order and its message roll back together.
        before = (Order.objects.count(), Message.objects.count())
        try:
            with transaction.atomic():
                place_order("Mallory", Decimal("1.00"), ["refused"])
                raise _Rollback
        except _Rollback:
            pass
        after = (Order.objects.count(), Message.objects.count())
        self.stdout.write(
            "outbox: a rolled-back order left "
            + ("nothing behind" if after == before else f"traces: {before} → {after}")
        )
        first = Order.objects.order_by("-id")[: len(ORDERS)]
        ids = pgmb.send_batch(
            [("order.paid", {"order_id": order.pk}) for order in first]
            + [pgmb.Outgoing("order.shipped.eu", {"carrier": "DHL"}, headers={"region": "eu"})]
        )
        self.stdout.write(
            f"send_batch: {len(ids)} messages in one INSERT ({len(ids) - 1} order.paid, "
            "order.shipped.eu)"
        )
        unrouted = pgmb.send("inventory.restocked", {"sku": "pen", "count": 100})
        self.stdout.write(
            f"unrouted: inventory.restocked {unrouted} matches no queue "
            "(admin: Messages, filter routed = No)"
        )

    def _summary(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT name, binding_key, worker, pending, dead_letters FROM pgmb.queues "
                "WHERE name IN ('order_queue', 'audit_queue', 'flaky_queue') ORDER BY name"
            )
            rows = cursor.fetchall()
            cursor.execute("SELECT count(*) FILTER (WHERE NOT routed), count(*) FROM pgmb.messages")
            unrouted, total = cursor.fetchone()
        self.stdout.write(f"messages: {total} stored, {unrouted} unrouted")
        for name, binding, worker, pending, dead in rows:
            self.stdout.write(
                f"queue {name} ({binding} → {worker}): {pending} pending, {dead} dead letters"
            )
        self.stdout.write("try: SELECT * FROM pgmb.order_queue WHERE acknoledge = false;")
