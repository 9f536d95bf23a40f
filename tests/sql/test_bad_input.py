"""Bad input through the SQL API and plain SQL: a clear error with a proper SQLSTATE,
and nothing written."""

import threading
import uuid

import psycopg
import pytest
from django.db import connection, transaction
from psycopg.errors import CheckViolation

from pgmb.models import Message, Queue, Worker
from tests.waiting import DEADLINE, wait_until

INVALID_NAME = "42602"
INVALID_VALUE = "22023"
UNIQUE = "23505"
FOREIGN_KEY = "23503"
CHECK = "23514"
NOT_NULL = "22004"
BAD_JSON = "22P02"

BAD_NAMES = [
    "Order",
    "order queue",
    "1order",
    "order-queue",
    'order"; DROP TABLE pgmb_message; --',
    "order'",
    "x" * 49,
    "",
    "_order",
    "ordér",
    "order\n",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_worker_names(sql, raises_sql, name):
    with raises_sql(INVALID_NAME, "invalid worker name"):
        sql("SELECT pgmb.worker(%s, 'http://127.0.0.1/', 10)", (name,))
    assert not Worker.objects.exists()
    assert sql("SELECT to_regclass('pgmb_message')") != [(None,)]


@pytest.mark.parametrize("name", [*BAD_NAMES, "x_dead_letter", "x_dead_letter_queue", "q" * 46])
def test_bad_queue_names(sql, raises_sql, make_worker, name):
    worker = make_worker()
    with raises_sql(INVALID_NAME, "invalid queue name"):
        sql("SELECT pgmb.create(%s, '#', 1, %s)", (name, worker.pk))
    assert not Queue.objects.exists()


def test_longest_queue_names_fit_their_views(sql, make_worker):
    worker = make_worker()
    sql("SELECT pgmb.create(%s, '#', 1, %s)", ("q" * 45, worker.pk))
    sql("SELECT pgmb.create(%s, '#', 1, %s)", ("r" * 42 + "_queue", worker.pk))
    [(views,)] = sql(
        "SELECT count(*) FROM information_schema.views WHERE table_schema = 'pgmb' "
        "AND table_name IN (%s, %s)",
        ("q" * 45 + "_dead_letter_queue", "r" * 42 + "_dead_letter_queue"),
    )
    assert views == 2


def test_duplicate_and_clashing_queue_names(sql, raises_sql, make_worker):
    worker = make_worker()
    sql("SELECT pgmb.create('order_queue', '#', 1, %s)", (worker.pk,))
    with raises_sql(UNIQUE, "queue 'order_queue' already exists"):
        sql("SELECT pgmb.create('order_queue', '#', 1, %s)", (worker.pk,))
    with raises_sql(UNIQUE, "clashes with queue 'order_queue'"):
        sql("SELECT pgmb.create('order', '#', 1, %s)", (worker.pk,))
    assert Queue.objects.count() == 1


@pytest.mark.parametrize(
    "endpoint",
    [
        "ftp://example.com/",
        "localhost:8080/process",
        "http://",
        "javascript:alert(1)",
        "",
        "http:// x/",
    ],
)
def test_bad_endpoints(sql, raises_sql, endpoint):
    with raises_sql(INVALID_VALUE, "invalid endpoint"):
        sql("SELECT pgmb.worker('w', %s, 10)", (endpoint,))
    assert not Worker.objects.exists()


@pytest.mark.parametrize("rps", [0, -5])
def test_bad_rps(sql, raises_sql, rps):
    with raises_sql(INVALID_VALUE, "invalid rps"):
        sql("SELECT pgmb.worker('w', 'http://127.0.0.1/', %s)", (rps,))
    assert not Worker.objects.exists()


def test_duplicate_worker(sql, raises_sql):
    sql("SELECT pgmb.worker('w', 'http://127.0.0.1/', 1)")
    with raises_sql(UNIQUE, "worker 'w' already exists"):
        sql("SELECT pgmb.worker('w', 'http://127.0.0.1/', 1)")
    assert Worker.objects.count() == 1


def test_negative_retries_and_unknown_worker(sql, raises_sql, make_worker):
    worker = make_worker()
    with raises_sql(INVALID_VALUE, "invalid max_retries"):
        sql("SELECT pgmb.create('q', '#', -1, %s)", (worker.pk,))
    with raises_sql(FOREIGN_KEY, "unknown worker id 550e8400"):
        sql("SELECT pgmb.create('q', '#', 1, '550e8400-e29b-41d4-a716-446655440000')")
    assert not Queue.objects.exists()


@pytest.mark.parametrize("binding", ["a*", "order.cre#", "", "a b", "a\tb", "x" * 256, "*x.y"])
def test_bad_binding_keys(sql, raises_sql, make_worker, binding):
    worker = make_worker()
    with raises_sql(INVALID_VALUE, "binding key"):
        sql("SELECT pgmb.create('q', %s, 1, %s)", (binding, worker.pk))
    assert not Queue.objects.exists()


@pytest.mark.parametrize("key", ["order.*", "order.#", "", "a b", "a\nb", "x" * 256])
def test_bad_routing_keys_through_send(sql, raises_sql, key):
    with raises_sql(INVALID_VALUE, "routing key"):
        sql("SELECT pgmb.send(gen_random_uuid(), %s, '{}')", (key,))
    assert not Message.objects.exists()


@pytest.mark.parametrize("key", ["order.*", "#", "", "a b"])
def test_bad_routing_keys_through_plain_insert(sql, raises_sql, key):
    with raises_sql(CHECK, "pgmb_message_routing_key_valid"):
        sql("INSERT INTO pgmb_message (routing_key, body) VALUES (%s, '{}')", (key,))
    assert not Message.objects.exists()


def test_body_must_be_json(sql, raises_sql):
    with raises_sql(BAD_JSON, "invalid input syntax for type json"):
        sql("SELECT pgmb.send(gen_random_uuid(), 'a', '{not json'::text::jsonb)")
    with raises_sql(NOT_NULL, "body is required"):
        sql("SELECT pgmb.send(gen_random_uuid(), 'a', NULL::jsonb)")
    with raises_sql(INVALID_VALUE, "headers must be a JSON object"):
        sql("SELECT pgmb.send(gen_random_uuid(), 'a', '{}', '[1]')")
    with raises_sql(INVALID_VALUE, "seconds must not be negative"):
        sql("SELECT pgmb.send(gen_random_uuid(), 'a', '{}', '{}', -1)")
    assert not Message.objects.exists()


def test_duplicate_message_id(sql, raises_sql):
    [(mid,)] = sql("SELECT pgmb.send(gen_random_uuid(), 'a', '1')")
    with raises_sql(UNIQUE, f"message {mid} already exists"):
        sql("SELECT pgmb.send(%s, 'a', '2')", (mid,))
    assert list(Message.objects.values_list("body", flat=True)) == [1]


def test_bad_routing_keys_without_any_queue(sql, raises_sql):
    """The key rule does not depend on routing: with no queue at all a bad key is refused."""
    with raises_sql(CHECK, "invalid routing key 'a b': blanks"):
        sql("INSERT INTO pgmb_message (routing_key, body) VALUES ('ok', '1'), ('a b', '2')")
    assert not Message.objects.exists()


def test_bad_routing_keys_through_copy(db, make_queue):
    """COPY, the fastest way to load messages, is held to the same rule."""
    make_queue("#")
    with (
        pytest.raises(CheckViolation, match=r"invalid routing key 'x\.#'"),
        transaction.atomic(),
        connection.cursor() as cursor,
        cursor.cursor.copy("COPY pgmb_message (routing_key, body) FROM STDIN") as copy,
    ):
        copy.write_row(("fine.key", "1"))
        copy.write_row(("x.#", "2"))
    assert not Message.objects.exists()


def test_a_routing_key_cannot_be_updated_to_a_bad_one(sql, raises_sql, make_queue):
    make_queue("#")
    [(mid,)] = sql("SELECT pgmb.send(gen_random_uuid(), 'order.created', '1')")
    with raises_sql(CHECK, "pgmb_message_routing_key_valid"):
        sql("UPDATE pgmb_message SET routing_key = 'order.*' WHERE id = %s", (mid,))
    sql("UPDATE pgmb_message SET routing_key = 'order.paid' WHERE id = %s", (mid,))
    assert Message.objects.get().routing_key == "order.paid"


@pytest.mark.django_db(transaction=True)
def test_a_message_id_sent_twice_at_once():
    """The second of two concurrent sends of one id waits for the first and, once it has
    committed, gets the same clear refusal as a late duplicate (not a bare key violation)."""
    mid = uuid.uuid4()
    params = connection.get_connection_params()
    with psycopg.connect(**params) as first, psycopg.connect(**params, autocommit=True) as second:
        first.execute("SELECT pgmb.send(%s, 'order.created', '1')", (mid,))
        pid = second.info.backend_pid
        outcome: list[BaseException | None] = []

        def send_again() -> None:
            try:
                second.execute("SELECT pgmb.send(%s, 'order.created', '2')", (mid,))
                outcome.append(None)
            except psycopg.Error as exc:
                outcome.append(exc)

        thread = threading.Thread(target=send_again)
        thread.start()
        with psycopg.connect(**params, autocommit=True) as watcher:
            wait_until(
                lambda: watcher.execute(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                    (pid,),
                ).fetchone()[0],
                message="the second send to wait for the first",
            )
        first.commit()
        thread.join(DEADLINE)
    [error] = outcome
    assert isinstance(error, psycopg.errors.UniqueViolation)
    assert f"message {mid} already exists" in str(error)
    assert list(Message.objects.values_list("body", flat=True)) == [1]


def test_a_failed_statement_routes_nothing(sql, raises_sql, make_queue):
    """A multi-row INSERT with one bad row stores no message and no delivery."""
    make_queue("#")
    with raises_sql(CHECK):
        sql("INSERT INTO pgmb_message (routing_key, body) VALUES ('ok', '1'), ('bad*', '2')")
    assert not Message.objects.exists()
    assert not Queue.objects.get().deliveries.exists()
