"""Unique while live (docs/publishing.md, docs/decisions/0090-unique-while-live.md): while a
delivery with a unique key is live on a queue, another message with the key is skipped
there (the caller gets the live one's message id) or replaces the pending one; per queue;
through Python's pgmb.send and SQL's pgmb.send_unique. The concurrent tests send from real
sessions at once (each its own connection and thread)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import psycopg
import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

import pgmb
from pgmb import deliveries, pull
from pgmb.db.conninfo import conninfo_from_django
from pgmb.deliveries import Success
from pgmb.models import Delivery, Message, Queue
from tests.waiting import DEADLINE

pytestmark = pytest.mark.django_db


def _live(key: str) -> list[tuple[str, uuid.UUID, str]]:
    """(queue name, message id, state) of each delivery holding ``key``, by queue name."""
    return sorted(
        (d.queue.name, d.message_id, d.state)
        for d in Delivery.objects.filter(unique_key=key).select_related("queue")
    )


def _sql_send(routing_key: str, body: str, key: str, mode: str = "skip") -> uuid.UUID:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pgmb.send_unique(gen_random_uuid(), %s, %s::jsonb, %s, %s)",
            (routing_key, body, key, mode),
        )
        return cursor.fetchone()[0]


def _python_send(routing_key: str, body: str, key: str, mode: str = "skip") -> uuid.UUID:
    return pgmb.send(routing_key, int(body), unique_key=key, on_duplicate=mode)


SENDERS = pytest.mark.parametrize("send", [_python_send, _sql_send], ids=["python", "sql"])


@SENDERS
def test_a_second_message_with_a_live_key_is_skipped(make_queue, send):
    queue = make_queue("uk.#")
    first = send("uk.a", "1", "order-1")
    again = send("uk.a", "2", "order-1")
    assert again == first
    assert _live("order-1") == [(queue.name, first, "ready")]
    # Skipped on its only queue: nothing stored.
    assert Message.objects.filter(unique_key="order-1").count() == 1
    other = send("uk.a", "3", "order-2")  # another key is another job
    assert other != first


@SENDERS
def test_the_key_is_free_once_the_delivery_is_settled(make_queue, send):
    make_queue("uk.#")
    first = send("uk.a", "1", "k")
    [claimed] = deliveries.claim()
    assert deliveries.ack([Success(claimed.delivery_id, 200, 0.1)]) == 1
    second = send("uk.a", "2", "k")
    assert second != first
    assert [m for _, m, _ in _live("k")] == [second]


@SENDERS
def test_a_leased_delivery_is_live_for_skip(make_queue, send):
    make_queue("uk.#")
    first = send("uk.a", "1", "k")
    deliveries.claim()
    assert send("uk.a", "2", "k") == first
    assert [s for _, _, s in _live("k")] == ["leased"]


@SENDERS
def test_replace_takes_the_pending_deliverys_place(make_queue, send):
    queue = make_queue("uk.#")
    first = send("uk.a", "1", "k")
    second = send("uk.a", "2", "k", "replace")
    assert second != first
    assert _live("k") == [(queue.name, second, "ready")]
    assert not Delivery.objects.filter(message_id=first).exists()
    [claimed] = deliveries.claim()
    assert claimed.message_id == str(second)


@SENDERS
def test_replace_follows_a_delivery_in_flight(make_queue, send):
    """A request under way cannot be taken back: it gives up the key and finishes; the new
    message is delivered after it."""
    queue = make_queue("uk.#")
    first = send("uk.a", "1", "k")
    [claimed] = deliveries.claim()
    second = send("uk.a", "2", "k", "replace")
    assert _live("k") == [(queue.name, second, "ready")]
    assert Delivery.objects.get(message_id=first).state == "leased"
    assert deliveries.ack([Success(claimed.delivery_id, 200, 0.1)]) == 1
    [after] = deliveries.claim()
    assert after.message_id == str(second)


@SENDERS
def test_the_rule_holds_per_queue(make_queue, send):
    every = make_queue("uk.#", name="uk_a")
    some = make_queue("uk.x", name="uk_b")
    first = send("uk.y", "1", "k")  # uk_a only
    second = send("uk.x", "2", "k")  # skipped on uk_a, delivered on uk_b: stored
    assert second != first
    assert _live("k") == [("uk_a", first, "ready"), ("uk_b", second, "ready")]
    # Every queue skips: the live one's of the first queue by name.
    assert send("uk.x", "3", "k") == first
    assert Message.objects.filter(unique_key="k").count() == 2
    assert every and some


def test_a_send_without_a_key_runs_one_statement_and_with_a_key_one_more_to_skip(make_queue):
    make_queue("uk.#")
    with CaptureQueriesContext(connection) as plain:
        pgmb.send("uk.a", 1)
    with CaptureQueriesContext(connection) as keyed:
        first = pgmb.send("uk.a", 1, unique_key="k")
    with CaptureQueriesContext(connection) as skipped:
        assert pgmb.send("uk.a", 2, unique_key="k") == first
    assert (len(plain), len(keyed), len(skipped)) == (1, 1, 2)
    # Without a key the statement names no unique column (the hot path is unchanged).
    assert "unique_key" not in plain.captured_queries[0]["sql"]


def test_a_batch_delivers_the_first_of_a_key_per_queue(make_queue):
    queue = make_queue("uk.#")
    live = pgmb.send("uk.a", 0, unique_key="held")
    ids = pgmb.send_batch(
        [
            {"routing_key": "uk.a", "body": 1, "unique_key": "k"},
            {"routing_key": "uk.a", "body": 2, "unique_key": "k"},
            {"routing_key": "uk.a", "body": 3, "unique_key": "held"},
            ("uk.a", 4),
        ]
    )
    assert ids[2] == live  # skipped on its only queue: the live one's id
    assert _live("k") == [(queue.name, ids[0], "ready")]
    assert not Delivery.objects.filter(message_id=ids[1]).exists()
    assert Delivery.objects.filter(message_id=ids[3], unique_key=None).exists()


def test_requeue_and_replay_make_deliveries_without_a_key(make_queue):
    """An operator's requeue or replay asks for that delivery: it holds no key, so it never
    collides with a live one."""
    make_queue("uk.#", max_retries=0)
    first = pgmb.send("uk.a", 1, unique_key="k")
    [claimed] = deliveries.claim()
    deliveries.fail([deliveries.Failure(claimed.delivery_id, claimed.lease_id, 500, "boom")])
    second = pgmb.send("uk.a", 2, unique_key="k")  # a dead letter frees the key
    assert second != first
    assert deliveries.requeue_queue(Delivery.objects.get().queue.name) == 1
    assert Delivery.objects.get(message_id=first).unique_key is None
    assert [m for _, m, _ in _live("k")] == [second]


# --- concurrent senders: real sessions, started together --------------------------------


def _at_once(count: int, call: Callable[[psycopg.Connection], uuid.UUID]) -> list[uuid.UUID]:
    """``call`` in ``count`` sessions of their own, released together; their results."""
    params = conninfo_from_django("default")
    sessions = [psycopg.connect(**params, autocommit=True) for _ in range(count)]
    start = threading.Barrier(count)
    results: list[uuid.UUID | BaseException] = [RuntimeError("not run")] * count

    def run(i: int) -> None:
        try:
            start.wait(DEADLINE)
            results[i] = call(sessions[i])
        except BaseException as exc:  # reported below, with the others
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE)
    finally:
        for session in sessions:
            session.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    return [r for r in results if isinstance(r, uuid.UUID)]


def _send_unique(key: str, mode: str) -> Callable[[psycopg.Connection], uuid.UUID]:
    def call(session: psycopg.Connection) -> uuid.UUID:
        row = session.execute(
            "SELECT pgmb.send_unique(gen_random_uuid(), 'race.a', '{}'::jsonb, %s, %s)",
            (key, mode),
        ).fetchone()
        assert row is not None
        return row[0]

    return call


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_", range(3))
def test_concurrent_senders_of_one_key_get_one_live_delivery_per_queue(make_queue, round_):
    make_queue("race.#", name="race_a")
    make_queue("race.a", name="race_b")
    key = f"race-{round_}"
    ids = _at_once(8, _send_unique(key, "skip"))
    live = _live(key)
    assert [q for q, _, _ in live] == ["race_a", "race_b"]
    # One sender's message holds both queues (the first stored was free everywhere); every
    # caller was told its id.
    assert {m for _, m, _ in live} == set(ids) and len(set(ids)) == 1
    assert Message.objects.filter(unique_key=key).count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_python_senders_get_the_live_ones_id(make_queue):
    make_queue("race.#")
    count = 6
    start = threading.Barrier(count)
    results: list[object] = [None] * count

    def run(i: int) -> None:
        try:
            start.wait(DEADLINE)
            results[i] = pgmb.send("race.a", {"sender": i}, unique_key="py")
        except BaseException as exc:  # reported below
            results[i] = exc
        finally:
            connections.close_all()  # this thread's own session

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE)
    assert all(isinstance(r, uuid.UUID) for r in results), results
    [(_, live, _)] = _live("py")
    assert set(results) == {live}


@pytest.mark.django_db(transaction=True)
def test_concurrent_replacements_leave_one_live_delivery(make_queue):
    make_queue("race.#")
    ids = _at_once(8, _send_unique("swap", "replace"))
    assert len(set(ids)) == 8  # each replaced the one before: all stored
    [(_, live, state)] = _live("swap")
    assert live in ids and state == "ready"
    assert Delivery.objects.count() == 1


def test_replace_follows_a_pull_message_that_was_read(db):
    """On a pull queue a message read and not visible again is in flight: its consumer
    still deletes it; the new message is read after."""
    Queue.objects.create(name="pulled", binding_key="uk.#", worker=None)
    first = pgmb.send("uk.a", 1, unique_key="k")
    [read] = pull.read("pulled", vt=30, qty=10)
    second = pgmb.send("uk.a", 2, unique_key="k", on_duplicate="replace")
    assert _live("k") == [("pulled", second, "ready")]
    assert pull.delete("pulled", [read]) == [read.id]
    assert not Delivery.objects.filter(message_id=first).exists()
    [after] = pull.read("pulled", vt=30, qty=10)
    assert str(after.message_id) == str(second)
