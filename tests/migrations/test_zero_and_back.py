"""Migrations run forwards and backwards on a real database, leaving nothing behind."""

import pytest
from django.core.management import call_command
from django.db import connection


def _state() -> dict:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM information_schema.tables"
            "        WHERE table_name LIKE 'pgmb\\_%%'),"
            " (SELECT count(*) FROM pg_namespace WHERE nspname = 'pgmb'),"
            " (SELECT count(*) FROM pg_proc WHERE proname LIKE 'pgtrigger\\_%%')"
        )
        tables, schema, trigger_functions = cursor.fetchone()
    return {"tables": tables, "schema": schema, "trigger_functions": trigger_functions}


@pytest.mark.django_db(transaction=True)
def test_migrate_to_zero_and_back(make_queue):
    # Nine trigger functions since 0029 (check_routing_key_update).
    make_queue("#", name="order_queue")
    assert _state() == {"tables": 11, "schema": 1, "trigger_functions": 9}
    try:
        call_command("migrate", "pgmb", "zero", verbosity=0)
        assert _state() == {"tables": 0, "schema": 0, "trigger_functions": 0}
    finally:
        call_command("migrate", "pgmb", verbosity=0)
    assert _state() == {"tables": 11, "schema": 1, "trigger_functions": 9}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgmb.worker('w', 'http://127.0.0.1/', 1)")
        [(worker_id,)] = cursor.fetchall()
        cursor.execute("SELECT pgmb.create('order_queue', 'order.*', %s, 1)", (worker_id,))
        cursor.execute("SELECT pgmb.send(gen_random_uuid(), 'order.created', '{}')")
        cursor.execute("SELECT count(*) FROM pgmb.order_queue")
        assert cursor.fetchone() == (1,)
