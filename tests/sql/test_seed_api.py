"""Every SQL snippet of the original pgmb README, run as written (with a real worker id
where the README has a placeholder), and what it must have done."""

import uuid

import pytest

from pgmb.models import Delivery, Message, Queue, Worker

PLACEHOLDER = "550e8400-e29b-41d4-a716-446655440000"

REGISTER = """
SELECT pgmb.worker(
    'order_processor',                    -- worker name
    'http://localhost:8080/process',      -- endpoint URL
    100                                   -- requests per second limit
);
"""

# The Quick Start's order: (name, binding_key, worker_id, max_retries).
CREATE_QUICK_START = """
SELECT pgmb.create(
    'order_queue',                        -- queue name
    'order.*',                            -- binding key pattern (supports *)
    '550e8400-e29b-41d4-a716-446655440000', -- worker UUID
    5                                     -- max retries
);
"""

# The API reference's order: (name, binding_key, max_retries, worker_id).
CREATE_REFERENCE = """
SELECT pgmb.create('order_queue', 'order.*', 5, '550e8400-e29b-41d4-a716-446655440000');
"""

SENDS = [
    """
SELECT pgmb.send(
    gen_random_uuid(),
    'order.created',
    '{"order_id": 123, "amount": 45.67}'::jsonb
);""",
    """
SELECT pgmb.send(
    gen_random_uuid(),
    'order.created',
    '{"order_id": 123, "amount": 45.67}'::jsonb,
    '{"source": "web", "priority": "high"}'::jsonb
);""",
    """
SELECT pgmb.send(
    gen_random_uuid(),
    'order.created',
    '{"order_id": 123, "amount": 45.67}'::jsonb,
    '{"source": "web"}'::jsonb,
    now() + interval '10 minutes'
);""",
    """
SELECT pgmb.send(
    gen_random_uuid(),
    'order.created',
    '{"order_id": 123, "amount": 45.67}'::jsonb,
    '{"source": "web"}'::jsonb,
    600
);""",
    """
SELECT pgmb.send(
    gen_random_uuid(),
    'order.created',
    '{"order_id": 123}'::jsonb
);""",
]

MONITORING = [
    "SELECT * FROM pgmb.workers;",
    "SELECT * FROM pgmb.queues;",
    "SELECT COUNT(*) FROM pgmb.order_queue WHERE acknoledge = false;",
    "SELECT * FROM pgmb.order_dead_letter_queue;",
]


def test_register_worker_returns_its_uuid(sql):
    [(worker_id,)] = sql(REGISTER)
    worker = Worker.objects.get(pk=worker_id)
    assert (worker.name, worker.endpoint, worker.rps) == (
        "order_processor",
        "http://localhost:8080/process",
        100,
    )
    [(second,)] = sql(
        "SELECT pgmb.worker('email_sender', 'http://api.example.com/send-email', 50);"
    )
    assert Worker.objects.get(pk=second).rps == 50


@pytest.mark.parametrize("snippet", [CREATE_QUICK_START, CREATE_REFERENCE], ids=["quick", "ref"])
def test_create_accepts_both_documented_argument_orders(sql, snippet):
    [(worker_id,)] = sql(REGISTER)
    [(queue_id,)] = sql(snippet.replace(PLACEHOLDER, str(worker_id)))
    queue = Queue.objects.get(pk=queue_id)
    assert (queue.name, queue.binding_key, queue.max_retries) == ("order_queue", "order.*", 5)
    assert queue.worker_id == worker_id
    assert queue.pattern == r"^\.order\.[^.]*$"


def test_the_whole_readme_in_order(sql):
    [(worker_id,)] = sql(REGISTER)
    sql(CREATE_QUICK_START.replace(PLACEHOLDER, str(worker_id)))
    ids = [sql(snippet)[0][0] for snippet in SENDS]
    assert all(isinstance(i, uuid.UUID) for i in ids)
    assert Message.objects.count() == 5

    plain, with_headers, delayed_ts, delayed_int, _ = (Message.objects.get(pk=i) for i in ids)
    assert plain.body == {"order_id": 123, "amount": 45.67}
    assert plain.headers == {}
    assert with_headers.headers == {"source": "web", "priority": "high"}
    for delayed in (delayed_ts, delayed_int):
        assert (delayed.available_at - delayed.created_at).total_seconds() == pytest.approx(600)
    assert plain.available_at == plain.created_at

    [(workers,)] = sql("SELECT count(*) FROM pgmb.workers")
    assert workers == 1
    [row] = sql("SELECT name, binding_key, pending FROM pgmb.queues")
    assert row == ("order_queue", "order.*", 5)
    [(pending,)] = sql(MONITORING[2])
    assert pending == 5
    assert sql(MONITORING[3]) == []
    for snippet in MONITORING:
        sql(snippet)

    # A delayed message is routed at once but not due before its time.
    due = {
        message_id
        for message_id, state in sql("SELECT message_id, state FROM pgmb.order_queue")
        if state == "ready"
    }
    assert due == {ids[0], ids[1], ids[4]}
    assert Delivery.objects.filter(available_at__gt=plain.created_at).count() == 2


def test_queue_views_follow_the_naming_rule(sql, make_worker):
    worker = make_worker()
    for name in ("order_queue", "emails", "a_queue_queue"):
        sql("SELECT pgmb.create(%s, '#', 1, %s)", (name, worker.pk))
    views = {
        name
        for (name,) in sql(
            "SELECT table_name FROM information_schema.views WHERE table_schema = 'pgmb'"
        )
    }
    assert {
        "order_queue",
        "order_dead_letter_queue",
        "emails_queue",
        "emails_dead_letter_queue",
        "a_queue_queue",
        "a_queue_dead_letter_queue",
    } <= views


def test_renaming_and_deleting_a_queue_moves_and_drops_its_views(sql, make_queue):
    queue = make_queue("#", name="before")
    sql("SELECT pgmb.send(gen_random_uuid(), 'x', '{}')")
    queue.name = "after_queue"
    queue.save()
    [(count,)] = sql("SELECT count(*) FROM pgmb.after_queue")
    assert count == 1
    assert sql("SELECT to_regclass('pgmb.before_queue')") == [(None,)]
    queue.delete()
    assert sql(
        "SELECT to_regclass('pgmb.after_queue'), to_regclass('pgmb.after_dead_letter_queue')"
    ) == [(None, None)]


def test_unrouted_message_is_stored_and_visible(sql, make_queue):
    make_queue("order.*")
    [(routed_id,)] = sql("SELECT pgmb.send(gen_random_uuid(), 'order.paid', '{}')")
    [(lost_id,)] = sql("SELECT pgmb.send(gen_random_uuid(), 'nobody.listens', '{}')")
    rows = dict(sql("SELECT id, routed FROM pgmb.messages"))
    assert rows == {routed_id: True, lost_id: False}
