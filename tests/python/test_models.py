"""Workers and queues through the ORM and model validation (what admin forms use)."""

import pytest
from django.core.exceptions import ValidationError
from django.db import DataError, IntegrityError, ProgrammingError, transaction

from pgmb.models import Queue, Worker


def test_queue_pattern_is_compiled_by_the_database(make_queue):
    queue = make_queue("order.#")
    queue.refresh_from_db()
    assert queue.pattern == r"^\.order(?:\.[^.]*)*$"
    assert queue.view_names == (f"{queue.name}_queue", f"{queue.name}_dead_letter_queue")


@pytest.mark.parametrize(
    "endpoint", ["http://web:8000/hook", "https://orders.internal/x?y=1", "HTTP://127.0.0.1/"]
)
def test_endpoints_the_database_accepts_pass_validation(db, endpoint):
    Worker(name="w", endpoint=endpoint).full_clean()
    Worker.objects.create(name="w", endpoint=endpoint)


@pytest.mark.parametrize(
    ("fields", "bad_field"),
    [
        ({"name": "Bad Name"}, "name"),
        ({"name": "x'; drop table pgmb_worker; --"}, "name"),
        ({"endpoint": "ftp://example.com/"}, "endpoint"),
        ({"endpoint": "not a url"}, "endpoint"),
        ({"endpoint": "http://"}, "endpoint"),
        ({"endpoint": "http://a b/"}, "endpoint"),
        ({"rps": 0}, "rps"),
        ({"timeout": 0}, "timeout"),
    ],
)
def test_worker_validation(db, fields, bad_field):
    worker = Worker(**{"name": "w", "endpoint": "http://127.0.0.1/", **fields})
    with pytest.raises(ValidationError) as info:
        worker.full_clean()
    assert bad_field in info.value.message_dict


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"name": "Bad Name"}, ProgrammingError),
        ({"endpoint": "ftp://example.com/"}, DataError),
        ({"rps": 0}, DataError),
    ],
)
def test_worker_orm_create_is_refused_by_the_database(db, fields, error):
    with pytest.raises(error), transaction.atomic():
        Worker.objects.create(**{"name": "w", "endpoint": "http://127.0.0.1/", **fields})
    assert not Worker.objects.exists()


@pytest.mark.parametrize(
    ("fields", "bad_field"),
    [
        ({"name": "Queue"}, "name"),
        ({"name": "x_dead_letter"}, "name"),
        ({"binding_key": "a*"}, "binding_key"),
        ({"binding_key": "a b"}, "binding_key"),
        ({"max_retries": -1}, "max_retries"),
        ({"backoff_base": 10, "backoff_max": 1}, "backoff_max"),
        ({"name": "order"}, "name"),  # clashes with order_queue's views
    ],
)
def test_queue_validation(make_worker, fields, bad_field):
    worker = make_worker()
    Queue.objects.create(name="order_queue", binding_key="#", worker=worker)
    queue = Queue(**{"name": "q", "binding_key": "#", "worker": worker, **fields})
    with pytest.raises(ValidationError) as info:
        queue.full_clean()
    assert bad_field in info.value.message_dict


@pytest.mark.parametrize(
    ("fields", "error", "text"),
    [
        ({"binding_key": "a*"}, DataError, "wildcards must be whole words"),
        ({"max_retries": -1}, DataError, "invalid max_retries"),
        ({"name": "order"}, IntegrityError, "clashes"),
    ],
)
def test_queue_orm_create_is_refused_by_the_database(make_worker, fields, error, text):
    worker = make_worker()
    Queue.objects.create(name="order_queue", binding_key="#", worker=worker)
    with pytest.raises(error, match=text), transaction.atomic():
        Queue.objects.create(**{"name": "q", "binding_key": "#", "worker": worker, **fields})
    assert Queue.objects.count() == 1


def test_worker_with_queues_cannot_be_deleted(make_queue, sql):
    queue = make_queue()
    with pytest.raises(IntegrityError), transaction.atomic():
        sql("SET CONSTRAINTS ALL IMMEDIATE")
        sql("DELETE FROM pgmb_worker WHERE id = %s", (queue.worker_id,))
    assert Worker.objects.filter(pk=queue.worker_id).exists()
