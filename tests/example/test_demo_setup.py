"""``manage.py demo_setup``: the demo's workers and queues, idempotently, and its traffic."""

from io import StringIO

from django.core.management import call_command
from django.db.models import Count

from pgmb.models import DeadLetter, Delivery, Message, Queue, Worker


def run(**options) -> str:
    out = StringIO()
    call_command("demo_setup", stdout=out, **options)
    return out.getvalue()


def topology():
    return (
        sorted(Worker.objects.values_list("name", "endpoint", "rps")),
        sorted(Queue.objects.values_list("name", "binding_key", "worker__name", "max_retries")),
    )


def test_demo_setup_registers_workers_queues_and_publishes(shop, sql):
    out = run(port=8123)

    workers, queues = topology()
    assert workers == [
        ("demo_worker", "http://127.0.0.1:8123/worker/orders/", 5),
        ("flaky_worker", "http://127.0.0.1:8123/worker/flaky/", 2),
    ]
    assert [q[:3] for q in queues] == [
        ("audit_queue", "order.#", "demo_worker"),
        ("flaky_queue", "order.created", "flaky_worker"),
        ("order_queue", "order.*", "demo_worker"),
    ]
    assert dict((q[0], q[3]) for q in queues)["flaky_queue"] == 2
    # Three orders through the outbox, one rolled back, four by send_batch, one unrouted.
    assert shop.Order.objects.count() == 3
    assert set(shop.Order.objects.values_list("message_id", flat=True)) == set(
        Message.objects.filter(routing_key="order.created").values_list("id", flat=True)
    )
    assert sorted(Message.objects.values_list("routing_key", flat=True)) == sorted(
        ["order.created"] * 3 + ["order.paid"] * 3 + ["order.shipped.eu", "inventory.restocked"]
    )
    assert sql("SELECT routing_key FROM pgmb.messages WHERE NOT routed") == [
        ("inventory.restocked",)
    ]
    pending = dict(Delivery.objects.values_list("queue__name").annotate(n=Count("*")))
    assert pending == {"order_queue": 6, "audit_queue": 7, "flaky_queue": 3}
    assert not DeadLetter.objects.exists()
    assert "worker demo_worker: created" in out
    assert "a rolled-back order left nothing behind" in out
    assert "inventory.restocked" in out
    assert "queue audit_queue (order.# → demo_worker): 7 pending, 0 dead letters" in out


def test_demo_setup_is_idempotent(shop):
    run(port=8123)
    first = topology()
    ids = set(Queue.objects.values_list("id", flat=True))

    out = run(port=8123)

    assert topology() == first
    assert set(Queue.objects.values_list("id", flat=True)) == ids
    assert "worker demo_worker: unchanged" in out
    assert "queue flaky_queue: unchanged" in out
    assert shop.Order.objects.count() == 6  # each run publishes new traffic


def test_demo_setup_brings_changed_rows_back(shop):
    run(port=8000, no_publish=True)
    Queue.objects.filter(name="flaky_queue").update(max_retries=9, paused=True)

    out = run(port=9000, no_publish=True)

    assert "worker demo_worker: updated (endpoint)" in out
    assert "queue flaky_queue: updated (max_retries, paused)" in out
    assert Worker.objects.get(name="flaky_worker").endpoint == "http://127.0.0.1:9000/worker/flaky/"
    assert Queue.objects.filter(name="flaky_queue", max_retries=2, paused=False).exists()
    assert not Message.objects.exists()
    assert not shop.Order.objects.exists()


def test_the_example_settings_show_every_pgmb_setting():
    import dataclasses
    import importlib

    from pgmb import conf

    example = importlib.import_module("example.settings")

    known = [f.name for f in dataclasses.fields(conf.Settings)]
    assert list(example.PGMB) == known, "keep example_project/example/settings.py's PGMB current"
    assert conf.errors(example.PGMB) == []
