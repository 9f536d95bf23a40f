"""Both HTTP transports keep their connections alive by the same rules, against real
servers: the external dispatcher's client (``pgmb.dispatch.http1``) and PL/Python's
(``pgmb.post_via_plpython``, pgmb/sql/plpython_transport.py). One table of cases runs through
both.

Each case posts one request at a time, as the in-database loop does, from one client (one
backend for PL/Python), and tells connections apart by the client port the server saw.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest

from pgmb.db.conninfo import conninfo_from_django
from pgmb.dispatch.client import new_session
from pgmb.dispatch.client import post as dispatcher_post
from tests.closinghttp import ClosingServer, Http10Server
from tests.httpserver import RecordingServer, held, reply, retry_after

Post = Callable[..., tuple]
#: The external dispatcher keeps this many bytes of an error's body (its default
#: RESPONSE_BODY_LIMIT); PL/Python keeps 500 characters.
BODY_LIMIT = 500


@pytest.fixture(params=["dispatcher", "plpython3u"])
def transport(request) -> str:
    return request.param


@pytest.fixture
def post(transport, transactional_db) -> Iterator[Post]:
    """POST through ``transport``, one client for the whole test; the outcome's
    (status, error, retry_after)."""
    if transport == "dispatcher":
        loop = asyncio.new_event_loop()
        client = new_session(64)

        def call_dispatcher(url, body=None, timeout=10.0, headers=None):
            outcome = loop.run_until_complete(
                dispatcher_post(
                    client,
                    url,
                    json.dumps(body).encode(),
                    # build_headers always gives the Content-Type; PL/Python adds it itself.
                    {"Content-Type": "application/json", **(headers or {})},
                    timeout,
                    BODY_LIMIT,
                )
            )
            return outcome.status, outcome.error, outcome.retry_after

        yield call_dispatcher
        loop.run_until_complete(client.close())
        loop.close()
        return
    with psycopg.connect(**conninfo_from_django("default"), autocommit=True) as pg:
        if (
            pg.execute(
                "SELECT to_regprocedure('pgmb.post_via_plpython(text, text, jsonb, float8)')"
            ).fetchone()[0]
            is None
        ):
            pytest.skip("plpython3u is not installed in the test database")

        def call_plpython(url, body=None, timeout=10.0, headers=None):
            return pg.execute(
                "SELECT (o).status, (o).error, (o).retry_after"
                " FROM (SELECT pgmb.post_via_plpython(%s, %s, %s::jsonb, %s) AS o) AS s",
                (url, json.dumps(body), json.dumps(headers or {}), timeout),
            ).fetchone()

        yield call_plpython


def test_requests_share_one_connection(post, recording_server):
    outcomes = [post(recording_server.url("/keep"), {"n": n}) for n in range(5)]
    assert outcomes == [(200, "", None)] * 5
    received = recording_server.wait_for(5)
    assert [r.json() for r in received] == [{"n": n} for n in range(5)]
    assert len({r.peer for r in received}) == 1
    assert received[0].headers["content-type"] == "application/json"
    assert received[0].headers["user-agent"] == "pgmb-dispatcher"


@pytest.mark.parametrize("mode", ["idle", "next"])
def test_a_server_closing_kept_connections_gets_every_request_once(post, mode):
    # "next": every request after the first goes out on a connection the server closes as
    # it arrives, and is sent again on a new one.
    with ClosingServer(mode) as server:
        outcomes = [post(server.url(), n) for n in range(8)]
        handled = server.handled
    assert outcomes == [(200, "", None)] * 8
    assert [json.loads(h.body) for h in handled] == list(range(8))
    assert len({h.client_port for h in handled}) == 8


def test_an_http_10_server_works(post):
    with Http10Server(body=b"fine, until I close") as server:
        outcomes = [post(server.url(), n) for n in range(5)]
        handled = server.handled
    assert outcomes == [(200, "", None)] * 5
    assert [json.loads(h.body) for h in handled] == list(range(5))
    assert len({h.client_port for h in handled}) == 5


def test_a_timeout_on_a_kept_connection_leaves_the_next_request_working(post, recording_server):
    gate = threading.Event()
    recording_server.script([200, held(gate), 200, 200])
    try:
        outcomes = [post(recording_server.url(), n, timeout=0.3) for n in range(4)]
    finally:
        gate.set()
    assert outcomes == [(200, "", None), (None, "timeout after 0.3s", None)] + [(200, "", None)] * 2
    first, timed_out, after, last = (r.peer for r in recording_server.wait_for(4))
    assert timed_out == first  # the kept connection was used, then dropped
    assert after != timed_out and last == after


def test_failures_read_to_the_end_and_keep_the_connection(post, transport, recording_server):
    recording_server.script(
        [
            reply(302, "moved", headers={"Location": "/elsewhere"}),
            retry_after(7, body="slow down"),
            reply(500, "é" * 2000),
            200,
        ]
    )
    moved, limited, broken, fine = (post(recording_server.url(), n) for n in range(4))
    assert moved == (302, "HTTP 302 redirect to /elsewhere (not followed): moved", None)
    assert limited == (429, "HTTP 429: slow down", 7.0)
    # PL/Python keeps 500 characters, the dispatcher 500 bytes (2 for each "é").
    kept = BODY_LIMIT // 2 if transport == "dispatcher" else 500
    assert broken == (500, "HTTP 500: " + "é" * kept, None)
    assert fine == (200, "", None)
    received = recording_server.wait_for(4)
    assert [r.path for r in received] == ["/"] * 4  # the redirect was not followed
    assert len({r.peer for r in received}) == 1


def test_a_body_past_the_limit_costs_its_connection(post, recording_server):
    recording_server.script([reply(200, b"x" * (2 << 20)), 200, 200])
    assert [post(recording_server.url(), n) for n in range(3)] == [(200, "", None)] * 3
    big, after, last = (r.peer for r in recording_server.wait_for(3))
    assert after != big and last == after


def test_refused_and_bad_urls_are_outcomes(post):
    status, error, _ = post("http://127.0.0.1:9/")
    assert status is None and "Connection refused" in error
    status, error, _ = post("ftp://127.0.0.1/")
    assert status is None and "unknown url type: 'ftp://127.0.0.1/'" in error
    # Errors are stored and shown: an endpoint's credentials never reach them.
    status, error, _ = post("ftp://user:pw@127.0.0.1/")
    assert status is None and "unknown url type: 'ftp://***:***@127.0.0.1/'" in error
    status, error, _ = post("http://user:pw@/in")
    assert status is None and "no host given: 'http://***:***@/in'" in error


def test_connections_to_several_servers_are_kept_apart(post, make_recording_server):
    servers: list[RecordingServer] = [make_recording_server() for _ in range(3)]
    for n in range(9):
        assert post(servers[n % 3].url(), n) == (200, "", None)
    for index, server in enumerate(servers):
        received = server.wait_for(3)
        assert [r.json() for r in received] == [index, index + 3, index + 6]
        assert len({r.peer for r in received}) == 1
