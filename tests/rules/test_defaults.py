"""Defaults have one home: the models declare each once, as Django's default and as the
column's DEFAULT, so every way of creating a worker or a queue gets the same values."""

from __future__ import annotations

import pytest

from pgmb.models import Queue, Worker

WORKER_DEFAULTS = ["rps", "timeout", "burst", "secret", "active"]
QUEUE_DEFAULTS = ["max_retries", "backoff_base", "backoff_max", "lease_seconds", "paused"]


def _python_default(model, name):
    return model._meta.get_field(name).get_default()


@pytest.mark.parametrize(
    ("model", "name"),
    [(Worker, n) for n in ("rps", "timeout", "burst")]
    + [(Queue, n) for n in ("max_retries", "backoff_base", "backoff_max", "lease_seconds")],
)
def test_each_default_is_declared_once_for_django_and_the_database(model, name, sql):
    field = model._meta.get_field(name)
    [(expression,)] = sql(
        "SELECT column_default FROM information_schema.columns"
        " WHERE table_name = %s AND column_name = %s",
        (model._meta.db_table, field.column),
    )
    [(column_default,)] = sql(f"SELECT {expression}")  # the catalog's own expression text
    assert float(column_default) == field.default


def test_sql_api_plain_insert_orm_and_admin_defaults_agree(sql):
    [(worker_id,)] = sql("SELECT pgmb.worker('by_sql', 'http://127.0.0.1/', 10)")
    sql("INSERT INTO pgmb_worker (name, endpoint) VALUES ('by_insert', 'http://127.0.0.1/')")
    Worker.objects.create(name="by_orm", endpoint="http://127.0.0.1/")
    sql("SELECT pgmb.create('q_sql', '#', %s, 0)", (worker_id,))
    sql(
        "INSERT INTO pgmb_queue (name, binding_key, pattern, worker_id)"
        " VALUES ('q_insert', 'a', '', %s)",
        (worker_id,),
    )
    Queue.objects.create(name="q_orm", binding_key="b", worker_id=worker_id)
    expected_worker = {name: _python_default(Worker, name) for name in WORKER_DEFAULTS}
    for worker in Worker.objects.all():
        assert {n: getattr(worker, n) for n in WORKER_DEFAULTS} == expected_worker, worker.name
    expected_queue = {name: _python_default(Queue, name) for name in QUEUE_DEFAULTS}
    for queue in Queue.objects.exclude(name="q_sql"):
        assert {n: getattr(queue, n) for n in QUEUE_DEFAULTS} == expected_queue, queue.name
    # pgmb.create() takes max_retries; the rest are the columns' defaults.
    by_sql = Queue.objects.get(name="q_sql")
    assert by_sql.max_retries == 0
    assert {n: getattr(by_sql, n) for n in QUEUE_DEFAULTS[1:]} == {
        n: expected_queue[n] for n in QUEUE_DEFAULTS[1:]
    }
