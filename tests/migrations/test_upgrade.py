"""Upgrades never break: a database migrated to the first migration and filled with live
deliveries (ready, delayed, leased, dead) is migrated to the newest one and delivers all
of them, through both dispatch paths, with its schema equal to a fresh install's."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import uuid
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from pgmb import deliveries
from pgmb.db.statements import arun
from pgmb.dispatch.engine import Dispatcher, Options
from tests.migrations.conftest import manage
from tests.waiting import wait_until

FINGERPRINT = (Path(__file__).parent / "fingerprint.sql").read_text()
KEY = b"upgrade-secret-key-0123456789"
SECRET = "whsec_" + base64.b64encode(KEY).decode()
FIRST = "0001_initial"


def _fill_at_first_migration(conn: psycopg.Connection, url: str) -> dict[str, uuid.UUID]:
    """Live data written with the SQL API as the first migration shipped it."""
    q = conn.execute
    [(worker,)] = q("SELECT pgmb.worker('upgrader', %s, 1000)", (url,)).fetchall()
    q("UPDATE pgmb_worker SET secret = %s", (SECRET,))
    for name, key, retries in [
        ("ready_queue", "ready.#", 2),
        ("delayed_queue", "delayed.#", 2),
        ("leased_queue", "leased.#", 2),
        ("dead_queue", "dead.#", 0),
    ]:
        q("SELECT pgmb.create(%s, %s, %s, %s)", (name, key, retries, worker))
    q("UPDATE pgmb_queue SET backoff_base = 0, backoff_max = 0")
    q("UPDATE pgmb_queue SET lease_seconds = 1 WHERE name = 'leased_queue'")
    ids = {}
    for kind in ("ready", "leased", "dead"):
        ids[kind] = uuid.uuid4()
        q("SELECT pgmb.send(%s, %s, %s)", (ids[kind], f"{kind}.one", f'{{"kind": "{kind}"}}'))
    ids["delayed"] = uuid.uuid4()
    q("SELECT pgmb.send(%s, 'delayed.one', '{\"kind\": \"delayed\"}', NULL, 2)", (ids["delayed"],))
    # 0001's claim took a burst argument; its fail, positional arrays.
    [(leased,)] = q("SELECT count(*) FROM pgmb.claim(ARRAY['leased_queue'], 10, 1.0)").fetchall()
    [(dead_id, lease)] = q(
        "SELECT delivery_id, lease_id FROM pgmb.claim(ARRAY['dead_queue'], 10, 1.0)"
    ).fetchall()
    q("SELECT pgmb.fail(ARRAY[%s]::bigint[], ARRAY[%s]::uuid[], ARRAY[500])", (dead_id, lease))
    states = dict(
        q("SELECT q.name, d.state FROM pgmb_delivery d JOIN pgmb_queue q ON q.id = d.queue_id")
    )
    assert leased == 1
    assert states == {"ready_queue": "ready", "delayed_queue": "ready", "leased_queue": "leased"}
    assert q("SELECT count(*) FROM pgmb_dead_letter").fetchone() == (1,)
    return ids


def _verify(request) -> bool:
    signed = (
        f"{request.headers['webhook-id']}.{request.headers['webhook-timestamp']}.".encode()
        + request.body
    )
    expected = base64.b64encode(hmac.new(KEY, signed, hashlib.sha256).digest()).decode()
    return request.headers["webhook-signature"] == f"v1,{expected}"


@pytest.mark.django_db
def test_a_database_full_of_live_deliveries_upgrades_and_delivers(scratch, recording_server):
    with scratch("pgmb_upgrade") as info, psycopg.connect(**info, autocommit=True) as conn:
        manage(info["dbname"], "migrate", "pgmb", FIRST, "--noinput", "-v", "0")
        ids = _fill_at_first_migration(conn, recording_server.url("/hook"))

        manage(info["dbname"], "migrate", "pgmb", "--noinput", "-v", "0")

        # Same schema as a fresh install (the test database): nothing of 0001 lingers.
        with connection.cursor() as cursor:
            cursor.execute(FINGERPRINT)
            fresh = cursor.fetchall()
        assert conn.execute(FINGERPRINT).fetchall() == fresh

        async def requeue() -> int:
            async with await psycopg.AsyncConnection.connect(**info, autocommit=True) as aconn:
                return await arun(aconn, deliveries.requeue_queue_call("dead_queue"))

        assert asyncio.run(requeue()) == 1

        def all_arrived() -> bool:
            # The delayed message is due two seconds after it was sent: until then a
            # dispatcher with --until-idle has nothing to wait for, so run it again.
            options = Options(until_idle=True, poll_interval=0.05, max_seconds=120)
            asyncio.run(Dispatcher(info, options).run())
            arrived = {r.headers["pgmb-message-id"] for r in recording_server.requests}
            return arrived >= {str(i) for i in ids.values()}

        wait_until(all_arrived, message="not every live delivery arrived after the upgrade")
        assert all(_verify(r) for r in recording_server.requests)
        assert conn.execute("SELECT count(*) FROM pgmb_delivery").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pgmb_dead_letter").fetchone() == (0,)
        outcomes = dict(
            conn.execute(
                "SELECT m.routing_key, array_agg(a.outcome ORDER BY a.id) FROM pgmb_attempt a"
                " JOIN pgmb_message m ON m.id = a.message_id GROUP BY 1"
            ).fetchall()
        )
        assert outcomes == {
            "ready.one": ["ack"],
            "delayed.one": ["ack"],
            "leased.one": ["expired", "ack"],  # its lease from before the upgrade ran out
            "dead.one": ["dead", "ack"],
        }
        # Leased by the old claim, which counted the attempt: its expiry after the upgrade
        # is that attempt, and the delivery that followed is the second.
        assert conn.execute(
            "SELECT array_agg(a.attempt ORDER BY a.id) FROM pgmb_attempt a"
            " JOIN pgmb_message m ON m.id = a.message_id WHERE m.routing_key = 'leased.one'"
        ).fetchone() == ([1, 2],)

        # The in-database path works on the upgraded database too.
        recording_server.clear()
        [(late,)] = conn.execute(
            "SELECT pgmb.send(gen_random_uuid(), 'ready.two', '{}')"
        ).fetchall()

        def loop_delivered() -> bool:
            conn.execute("CALL pgmb.dispatch_loop(1, 10)")
            return bool(recording_server.requests)

        wait_until(loop_delivered, message="the in-database loop did not deliver after upgrading")
        assert recording_server.requests[0].headers["pgmb-message-id"] == str(late)
        assert _verify(recording_server.requests[0])
