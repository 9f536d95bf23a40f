"""Migrating back from 0033 puts back 0031's PL/Python transport (one request at a time),
and the database delivers with it; migrating forward again delivers in windows."""

from __future__ import annotations

import psycopg
import pytest

from tests.migrations.conftest import manage
from tests.migrations.test_post_runs_back import SECRET, _delivers, _state


def _transport_version(conn: psycopg.Connection) -> str:
    transport, loop, present = _state(conn)
    if transport is None:
        pytest.skip("plpython3u is not installed in the test database")
    assert "pgmb.post_run_via_plpython(" in loop and all(present)
    [(run,)] = conn.execute(
        "SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure('pgmb.post_run_via_plpython("
        "text[], text[], jsonb[], float8[], integer, float8, float8, float8, float8)')"
    ).fetchall()
    versions = {v for v in ("0031", "0033") if f"pgmb_post_{v}" in transport}
    assert len(versions) == 1, versions
    (version,) = versions
    assert ("WINDOW" in run) == (version == "0033")
    return version


def test_migrating_back_restores_0031_and_keeps_delivering(scratch, recording_server):
    with scratch("pgmb_windows_back") as info:
        manage(info["dbname"], "migrate", "pgmb", "0033_plpython_windows")
        with psycopg.connect(**info, autocommit=True) as conn:
            [(worker_id,)] = conn.execute(
                "SELECT pgmb.worker('w', %s, 100000)", (recording_server.url("/windows"),)
            ).fetchall()
            conn.execute("UPDATE pgmb_worker SET secret = %s WHERE id = %s", (SECRET, worker_id))
            conn.execute("SELECT pgmb.create('q', 'windows.#', %s, 1)", (worker_id,))
            assert _transport_version(conn) == "0033"
            _delivers(conn, recording_server, "windows.first")
        manage(info["dbname"], "migrate", "pgmb", "0032_steady_plans")
        with psycopg.connect(**info, autocommit=True) as conn:
            assert _transport_version(conn) == "0031"
            _delivers(conn, recording_server, "windows.back")
        manage(info["dbname"], "migrate", "pgmb", "0033_plpython_windows")
        with psycopg.connect(**info, autocommit=True) as conn:
            assert _transport_version(conn) == "0033"
            _delivers(conn, recording_server, "windows.again")
