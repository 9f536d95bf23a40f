"""Pull queues among push queues: routing, push claims, lease reclaims, dead letters and
requeue, replay, metrics, views, SQL creation and wake-ups."""

from __future__ import annotations

import psycopg
import pytest

import pgmb
from pgmb import deliveries, pull
from pgmb.db.conninfo import conninfo_from_django
from pgmb.models import Attempt, DeadLetter, Delivery, Queue
from tests.waiting import wait_until


def test_push_claims_never_take_a_pull_queue(make_queue, make_pull_queue):
    push = make_queue("order.*")
    pulled = make_pull_queue("order.*")
    pgmb.send("order.created", {"n": 1})
    claims = deliveries.claim(None, 100)
    assert [c.queue for c in claims] == [push.name]
    assert deliveries.claim([pulled.name], 100) == []
    assert [m.body for m in pull.read(pulled.name, 30, 10)] == [{"n": 1}]
    assert not deliveries.busy([pulled.name])
    assert deliveries.next_wakeup([pulled.name]) is None


def test_reclaiming_expired_leases_leaves_reads_alone(make_pull_queue, sql):
    queue = make_pull_queue()
    pgmb.send("k", 1)
    [message] = pull.read(queue.name, 0, 1)
    sql("UPDATE pgmb_delivery SET available_at = now() - interval '1 hour'")
    assert deliveries.reclaim_expired() == 0
    delivery = Delivery.objects.get(pk=message.id)
    assert (delivery.state, delivery.attempts) == ("ready", 1)
    assert not Attempt.objects.exists()


def test_create_in_sql_without_a_worker_makes_a_pull_queue(db, sql, raises_sql):
    [(queue_id,)] = sql("SELECT pgmb.create('jobs', 'job.#', 2, NULL)")
    queue = Queue.objects.get(pk=queue_id)
    assert (queue.worker, queue.max_retries) == (None, 2)
    assert sql("SELECT worker_id, worker FROM pgmb.queues WHERE name = 'jobs'") == [(None, None)]
    with raises_sql("23503", "unknown worker id"):
        sql("SELECT pgmb.create('other', '#', 2, gen_random_uuid())")
    pgmb.send("job.x", {"a": 1})
    assert [m.body for m in pull.read("jobs", 30, 1)] == [{"a": 1}]


def test_dead_letters_of_a_pull_queue_requeue_and_read_again(make_pull_queue):
    queue = make_pull_queue(max_retries=0)
    mid = pgmb.send("k", {"n": 1})
    pull.read(queue.name, 0, 1)
    assert pull.read(queue.name, 0, 1) == []  # read 2 > 1 + max_retries: dead-lettered
    dead = DeadLetter.objects.get(queue=queue)
    assert deliveries.requeue(dead.pk) == 1
    [again] = pull.read(queue.name, 30, 1)
    assert (again.message_id, again.read_ct) == (mid, 1)
    pull.delete(queue.name, [again])
    # Replay delivers an acknowledged message again, to a pull queue as to any.
    assert deliveries.replay(mid) == 1
    assert [m.message_id for m in pull.read(queue.name, 30, 1)] == [mid]


def test_metrics_of_a_pull_queue(make_pull_queue):
    queue = make_pull_queue()
    pgmb.send_batch(("k", n) for n in range(3))
    read = pull.read(queue.name, 3600, 2)
    pull.delete(queue.name, read[:1])
    metrics = pgmb.metrics.queue(queue.name)
    assert (metrics.queue_length, metrics.queue_visible_length) == (2, 1)
    assert (metrics.delivered_last_hour, metrics.total_messages) == (1, 3)


@pytest.mark.django_db(transaction=True)
def test_a_waiting_consumer_is_woken_by_publishers(make_pull_queue):
    queue = make_pull_queue()
    with psycopg.connect(**conninfo_from_django("default"), autocommit=True) as conn:
        conn.execute("LISTEN pgmb")
        (me,) = conn.execute(
            "SELECT pgmb.dispatcher_start('consumer', 'here', 1, %s)", ([queue.name],)
        ).fetchone()
        assert conn.execute("SELECT pgmb.dispatcher_idle(%s)", (me,)).fetchone() == (True,)
        pgmb.send("k", 1)
        got = wait_until(lambda: list(conn.notifies(timeout=0.1, stop_after=1)), message="NOTIFY")
        assert got[0].channel == "pgmb"
        # Busy again: publishers stop notifying.
        conn.execute("SELECT pgmb.dispatcher_busy(%s)", (me,))
        pgmb.send("k", 2)
        # A notification committed before this statement arrives with its answer.
        conn.execute("SELECT 1")
        assert list(conn.notifies(timeout=0)) == []


def test_next_visible_says_when_a_consumer_should_read_again(make_pull_queue):
    queue = make_pull_queue()
    assert pull.next_visible(queue.name) is None  # empty
    pgmb.send("k", 1)
    assert pull.next_visible(queue.name) == 0
    pull.read(queue.name, 3600, 1)
    assert 3000 < pull.next_visible(queue.name) <= 3600
    Queue.objects.filter(pk=queue.pk).update(paused=True)
    assert pull.next_visible(queue.name) is None  # nothing is read until it is resumed
