"""Migrating back from 0030 puts back the transport and the loop that 0029 ran."""

from __future__ import annotations

import psycopg

from tests.migrations.conftest import manage


def _sources(conn: psycopg.Connection) -> tuple[str | None, str]:
    transport = conn.execute(
        "SELECT prosrc FROM pg_proc"
        " WHERE oid = to_regprocedure('pgmb.post_via_plpython(text, text, jsonb, float8)')"
    ).fetchone()
    [(loop,)] = conn.execute(
        "SELECT prosrc FROM pg_proc WHERE oid = 'pgmb.dispatch_loop'::regproc"
    ).fetchall()
    return (transport[0] if transport else None), loop


def test_migrating_back_restores_0029s_transport_and_loop(scratch):
    with scratch("pgmb_keepalive_back") as info:
        manage(info["dbname"], "migrate", "pgmb", "0030_keepalive_transport")
        with psycopg.connect(**info, autocommit=True) as conn:
            transport, loop = _sources(conn)
        if transport is None:
            # Without PL/Python only the loop changes.
            assert "transport := pgmb.http_transport()" in loop
        else:
            assert "http.client" in transport and "pgmb.post_via_plpython(c.endpoint" in loop
        manage(info["dbname"], "migrate", "pgmb", "0029_publish_costs")
        with psycopg.connect(**info, autocommit=True) as conn:
            transport, loop = _sources(conn)
        assert "pgmb.post_via_plpython" not in loop and "pgmb.post(c.endpoint" in loop
        if transport is not None:
            assert "urllib.request" in transport and "http.client" not in transport
        manage(info["dbname"], "migrate", "pgmb", "0030_keepalive_transport")
        with psycopg.connect(**info, autocommit=True) as conn:
            transport, loop = _sources(conn)
        assert "transport := pgmb.http_transport()" in loop
        if transport is not None:
            assert "http.client" in transport
