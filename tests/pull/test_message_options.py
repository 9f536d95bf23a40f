"""Message options on pull queues: reads take the most urgent first (and stay an index
scan), and a message's own max_retries and retry_delay replace the queue's."""

from __future__ import annotations

import pytest
from django.db import connection

import pgmb
from pgmb import pull
from pgmb.models import Attempt, DeadLetter, Delivery


def test_reads_take_the_most_urgent_first(make_pull_queue):
    queue = make_pull_queue()
    for n, priority in enumerate([5, -1, 0, -1]):
        pgmb.send("k", {"n": n}, priority=priority)
    assert [m.body["n"] for m in pull.read(queue.name, 30, 1)] == [1]
    # Same priority: publish order; then by priority.
    assert [m.body["n"] for m in pull.read(queue.name, 30, 10)] == [3, 2, 0]


def test_a_read_is_an_ordered_index_scan_of_the_claim_index(make_pull_queue):
    queue = make_pull_queue()
    pgmb.send_batch(("k", {"n": n}) for n in range(2000))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgmb_delivery")
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(
            "EXPLAIN SELECT d.id FROM pgmb_delivery d "
            "WHERE d.queue_id = %s AND d.state = 'ready' AND d.available_at <= now() "
            "ORDER BY d.priority, d.available_at, d.id LIMIT 100 FOR UPDATE OF d SKIP LOCKED",
            [queue.id],
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "pgmb_delivery_due" in plan
    assert "Sort" not in plan


def test_a_message_s_own_max_retries_dead_letters_it_sooner(make_pull_queue):
    queue = make_pull_queue(max_retries=5)
    pgmb.send("k", {"n": 1}, max_retries=0)
    pgmb.send("k", {"n": 2})
    first = pull.read(queue.name, 30, 10)
    assert sorted(m.body["n"] for m in first) == [1, 2]
    pull.set_vt(queue.name, first, 0)
    # Read once already and max_retries 0: dead-lettered instead of read again.
    assert [m.body["n"] for m in pull.read(queue.name, 30, 10)] == [2]
    dead = DeadLetter.objects.get(queue=queue)
    assert dead.message.body == {"n": 1}
    assert "max_retries 0" in dead.last_error


def test_a_nack_waits_the_message_s_own_retry_delay(make_pull_queue):
    queue = make_pull_queue(backoff_base=0, backoff_max=0)
    pgmb.send("k", {"n": 1}, retry_delay=1000)
    pgmb.send("k", {"n": 2})
    read = pull.read(queue.name, 30, 10)
    assert pull.nack(queue.name, read, ["no"] * len(read)) == 2
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT m.body->>'n', extract(epoch FROM d.available_at - now()) "
            "FROM pgmb_delivery d JOIN pgmb_message m ON m.id = d.message_id ORDER BY 1"
        )
        waits = dict(cursor.fetchall())
    assert 990 < waits["1"] < 1010
    assert waits["2"] < 10  # the queue's backoff: none
    assert Attempt.objects.filter(queue=queue, outcome="retry").count() == 2
    assert Delivery.objects.filter(queue=queue).count() == 2


@pytest.mark.parametrize("max_retries", [0, 1])
def test_a_nack_honours_the_message_s_max_retries(make_pull_queue, max_retries):
    queue = make_pull_queue(max_retries=5, backoff_base=0, backoff_max=0)
    pgmb.send("k", {"n": 1}, max_retries=max_retries)
    for _ in range(max_retries + 1):
        read = pull.read(queue.name, 30, 10)
        assert len(read) == 1
        pull.nack(queue.name, read, ["no"])
    assert DeadLetter.objects.filter(queue=queue).count() == 1
    assert not Delivery.objects.filter(queue=queue).exists()
