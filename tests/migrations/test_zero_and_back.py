"""Migrating pgmb to zero leaves nothing of it behind, and migrating back up gives a
database that delivers (on a scratch database beside the test database)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from pgmb.dispatch.engine import Dispatcher, Options
from tests.migrations.conftest import manage
from tests.waiting import wait_until

#: pgmb's tables (pgmb_dashboard is a model without one; the history tables' partitions
#: aside), schemas, and trigger functions (one per django-pgtrigger trigger of the models).
INSTALLED = {"tables": 14, "schema": 1, "trigger_functions": 16}


def _state(conn: psycopg.Connection) -> dict[str, int]:
    [(tables, schema, trigger_functions)] = conn.execute(
        "SELECT (SELECT count(*) FROM pg_class"
        "        WHERE relname LIKE 'pgmb\\_%' AND relkind IN ('r', 'p') AND NOT relispartition),"
        " (SELECT count(*) FROM pg_namespace WHERE nspname = 'pgmb'),"
        " (SELECT count(*) FROM pg_proc WHERE proname LIKE 'pgtrigger\\_%')"
    ).fetchall()
    return {"tables": tables, "schema": schema, "trigger_functions": trigger_functions}


@pytest.mark.django_db
def test_migrate_to_zero_and_back_then_deliver(scratch, recording_server):
    with scratch("pgmb_zero_and_back") as info:
        manage(info["dbname"], "migrate", "--noinput", "-v", "0")
        with psycopg.connect(**info, autocommit=True) as conn:
            assert _state(conn) == INSTALLED
            [(worker,)] = conn.execute("SELECT pgmb.worker('w', 'http://127.0.0.1/', 1)").fetchall()
            conn.execute("SELECT pgmb.create('order_queue', 'order.*', %s, 1)", (worker,))
            conn.execute("SELECT pgmb.send(gen_random_uuid(), 'order.created', '{}')")

        manage(info["dbname"], "migrate", "pgmb", "zero", "--noinput", "-v", "0")
        with psycopg.connect(**info, autocommit=True) as conn:
            assert _state(conn) == {"tables": 0, "schema": 0, "trigger_functions": 0}

        manage(info["dbname"], "migrate", "pgmb", "--noinput", "-v", "0")
        with psycopg.connect(**info, autocommit=True) as conn:
            assert _state(conn) == INSTALLED
            [(worker,)] = conn.execute(
                "SELECT pgmb.worker('w', %s, 100)", (recording_server.url("/back"),)
            ).fetchall()
            conn.execute("SELECT pgmb.create('order_queue', 'order.*', %s, 1)", (worker,))
            [(sent,)] = conn.execute(
                "SELECT pgmb.send(gen_random_uuid(), 'order.created', '{\"n\": 1}')"
            ).fetchall()
            assert conn.execute("SELECT count(*) FROM pgmb.order_queue").fetchone() == (1,)

            def delivered() -> bool:
                options = Options(until_idle=True, poll_interval=0.05, max_seconds=120)
                asyncio.run(Dispatcher(info, options).run())
                return bool(recording_server.requests)

            wait_until(delivered, message="nothing was delivered after migrating back up")
            assert [r.headers["pgmb-message-id"] for r in recording_server.requests] == [str(sent)]
            assert conn.execute("SELECT count(*) FROM pgmb_delivery").fetchone() == (0,)
