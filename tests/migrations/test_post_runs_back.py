"""Migrating back from 0031 puts back 0030's transport and loop, and the database delivers
with them; migrating forward again (to 0031) delivers through runs."""

from __future__ import annotations

import base64
import hashlib
import hmac

import psycopg

from tests.migrations.conftest import manage
from tests.migrations.test_keepalive_back import _sources
from tests.waiting import wait_until

KEY = b"runs-back-secret-key-0123456789"
SECRET = "whsec_" + base64.b64encode(KEY).decode()
RUN_FUNCTIONS = (
    "pgmb.post_run_via_plpython(text[], text[], jsonb[], float8[], integer, float8, float8,"
    " float8, float8)",
    "pgmb.load_plpython_transport()",
    "pgmb.run_headers(pgmb.claimed[], bigint)",
)


def _state(conn: psycopg.Connection) -> tuple[str | None, str, list[bool]]:
    transport, loop = _sources(conn)
    present = [
        conn.execute("SELECT to_regprocedure(%s) IS NOT NULL", (f,)).fetchone()[0]
        for f in RUN_FUNCTIONS
    ]
    return transport, loop, present


def _delivers(conn: psycopg.Connection, server, key: str) -> None:
    """A message sent now arrives through CALL pgmb.dispatch_loop, signed."""
    server.clear()
    [(message_id,)] = conn.execute(
        "SELECT pgmb.send(gen_random_uuid(), %s, '{\"n\": 1}')", (key,)
    ).fetchall()

    def delivered() -> bool:
        conn.execute("CALL pgmb.dispatch_loop(1, 10)")
        return not conn.execute("SELECT count(*) FROM pgmb_delivery").fetchone()[0]

    wait_until(delivered, message=f"the loop did not deliver {key}")
    [request] = server.requests
    assert request.headers["pgmb-message-id"] == str(message_id)
    signed = (
        f"{request.headers['webhook-id']}.{request.headers['webhook-timestamp']}.".encode()
        + request.body
    )
    expected = base64.b64encode(hmac.new(KEY, signed, hashlib.sha256).digest()).decode()
    assert request.headers["webhook-signature"] == f"v1,{expected}"


def test_migrating_back_restores_0030_and_keeps_delivering(scratch, recording_server):
    with scratch("pgmb_post_runs_back") as info:
        manage(info["dbname"], "migrate", "pgmb", "0031_indb_post_runs")
        with psycopg.connect(**info, autocommit=True) as conn:
            [(worker_id,)] = conn.execute(
                "SELECT pgmb.worker('w', %s, 100000)", (recording_server.url("/runs"),)
            ).fetchall()
            conn.execute("UPDATE pgmb_worker SET secret = %s WHERE id = %s", (SECRET, worker_id))
            conn.execute("SELECT pgmb.create('q', 'runs.#', %s, 1)", (worker_id,))
            transport, loop, present = _state(conn)
            assert "pgmb.post_run_via_plpython(" in loop and present[2]
            if transport is not None:
                assert "pgmb_post_0031" in transport and "http.client" not in transport
                assert all(present)
            _delivers(conn, recording_server, "runs.first")
        manage(info["dbname"], "migrate", "pgmb", "0030_keepalive_transport")
        with psycopg.connect(**info, autocommit=True) as conn:
            transport, loop, present = _state(conn)
            assert "post_run" not in loop and "pgmb.post_via_plpython(c.endpoint" in loop
            assert present == [False, False, False]
            if transport is not None:
                assert "http.client" in transport and "pgmb_post_0031" not in transport
            _delivers(conn, recording_server, "runs.back")
        manage(info["dbname"], "migrate", "pgmb", "0031_indb_post_runs")
        with psycopg.connect(**info, autocommit=True) as conn:
            transport, loop, present = _state(conn)
            assert "pgmb.post_run_via_plpython(" in loop
            if transport is not None:
                assert "pgmb_post_0031" in transport and all(present)
            _delivers(conn, recording_server, "runs.again")
