"""The PL/Python transport keeps its connections alive (migration 0030), against real servers.

Each test posts from one backend (the ``pg`` connection), as the in-database loop does, and
tells connections apart by the client port the server saw.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import psycopg
import pytest

import pgmb
from pgmb.models import Attempt, Delivery
from tests.closinghttp import ClosingServer, Http10Server
from tests.httpserver import RecordingServer, held, reply, retry_after

Post = Callable[..., tuple]


@pytest.fixture
def post(pg: psycopg.Connection) -> Post:
    """POST through pgmb.post_via_plpython from the test's backend; the outcome's fields."""
    if (
        pg.execute(
            "SELECT to_regprocedure('pgmb.post_via_plpython(text, text, jsonb, float8)')"
        ).fetchone()[0]
        is None
    ):
        pytest.skip("plpython3u is not installed in the test database")

    def call(url: str, body: object = None, timeout: float = 10.0, headers: dict | None = None):
        return pg.execute(
            "SELECT (o).status, (o).error, (o).retry_after"
            " FROM (SELECT pgmb.post_via_plpython(%s, %s, %s::jsonb, %s) AS o) AS s",
            (url, json.dumps(body), json.dumps(headers or {}), timeout),
        ).fetchone()

    return call


def test_requests_share_one_connection(post, recording_server):
    outcomes = [post(recording_server.url("/keep"), {"n": n}) for n in range(5)]
    assert outcomes == [(200, "", None)] * 5
    received = recording_server.wait_for(5)
    assert [r.json() for r in received] == [{"n": n} for n in range(5)]
    assert len({r.peer for r in received}) == 1
    assert received[0].headers["content-type"] == "application/json"
    assert received[0].headers["user-agent"] == "pgmb-dispatcher"


def test_the_loop_delivers_over_one_connection(
    transport, dispatch_until, recording_server, make_worker, make_queue
):
    make_queue("#", worker=make_worker(endpoint=recording_server.url("/loop")))
    pgmb.send_batch(("k", n) for n in range(30))
    dispatch_until(lambda: not Delivery.objects.exists(), "all 30 messages to be delivered")
    received = recording_server.requests
    assert sorted(r.json() for r in received) == list(range(30))
    assert Attempt.objects.filter(outcome="ack").count() == 30
    if transport == "plpython3u":
        assert len({r.peer for r in received}) == 1


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


def test_failures_read_to_the_end_and_keep_the_connection(post, recording_server):
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
    assert broken == (500, "HTTP 500: " + "é" * 500, None)
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
    assert status is None and "unknown url type" in error


def test_connections_to_several_servers_are_kept_apart(post, make_recording_server):
    servers: list[RecordingServer] = [make_recording_server() for _ in range(3)]
    for n in range(9):
        assert post(servers[n % 3].url(), n) == (200, "", None)
    for index, server in enumerate(servers):
        received = server.wait_for(3)
        assert [r.json() for r in received] == [index, index + 3, index + 6]
        assert len({r.peer for r in received}) == 1
