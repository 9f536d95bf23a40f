"""Upgrades never break: a database migrated to a previous release's last migration and
filled with live deliveries (ready, delayed, leased, dead) through the SQL API is migrated
to the newest one and delivers all of them, through both dispatch paths, with its schema
equal to a fresh install's. One run per previous release (tests/migrations/releases.py).
Here this checkout's code writes the previous release's schema and delivers; the previous
release's own code, running while the migration applies, is test_live_upgrade.py."""

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
from tests.migrations.releases import RELEASED
from tests.waiting import wait_until

FINGERPRINT = (Path(__file__).parent / "fingerprint.sql").read_text()
KEY = b"upgrade-secret-key-0123456789"
SECRET = "whsec_" + base64.b64encode(KEY).decode()
PREVIOUS = RELEASED or [
    pytest.param(
        None,
        marks=pytest.mark.skip(
            reason="no release before 0.1.0: upgrades are tested from 0.2 on, from 0.1.0"
        ),
    )
]


def _fill(conn: psycopg.Connection, url: str) -> dict[str, uuid.UUID]:
    """Live data written with the SQL API of 0.1.0, which later releases keep."""
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
    q("UPDATE pgmb_worker SET timeout = 0.5")  # shorter than the lease below
    q("UPDATE pgmb_queue SET lease_seconds = 1 WHERE name = 'leased_queue'")
    ids = {}
    for kind in ("ready", "leased", "dead"):
        ids[kind] = uuid.uuid4()
        q("SELECT pgmb.send(%s, %s, %s)", (ids[kind], f"{kind}.one", f'{{"kind": "{kind}"}}'))
    ids["delayed"] = uuid.uuid4()
    q("SELECT pgmb.send(%s, 'delayed.one', '{\"kind\": \"delayed\"}', NULL, 2)", (ids["delayed"],))
    # A lease whose request started (pgmb.start) counts its attempt when it expires.
    [(leased_id, leased_lease)] = q(
        "SELECT delivery_id, lease_id FROM pgmb.claim(ARRAY['leased_queue'], 10)"
    ).fetchall()
    [(started,)] = q(
        "SELECT pgmb.start(ARRAY[%s]::bigint[], ARRAY[%s]::uuid[])", (leased_id, leased_lease)
    ).fetchall()
    [(dead_id, lease)] = q(
        "SELECT delivery_id, lease_id FROM pgmb.claim(ARRAY['dead_queue'], 10)"
    ).fetchall()
    q("SELECT pgmb.fail(ARRAY[%s]::bigint[], ARRAY[%s]::uuid[], ARRAY[500])", (dead_id, lease))
    states = dict(
        q("SELECT q.name, d.state FROM pgmb_delivery d JOIN pgmb_queue q ON q.id = d.queue_id")
    )
    assert started == 1
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
@pytest.mark.parametrize("previous", PREVIOUS)
def test_a_database_full_of_live_deliveries_upgrades_and_delivers(
    scratch, recording_server, previous
):
    with scratch("pgmb_upgrade") as info, psycopg.connect(**info, autocommit=True) as conn:
        manage(info["dbname"], "migrate", "pgmb", previous, "--noinput", "-v", "0")
        ids = _fill(conn, recording_server.url("/hook"))

        manage(info["dbname"], "migrate", "pgmb", "--noinput", "-v", "0")

        # Same schema as a fresh install (the test database): nothing of the old one lingers.
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
        # Leased and started before the upgrade: its expiry after it is that attempt, and
        # the delivery that followed is the second.
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
