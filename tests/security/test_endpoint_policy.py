"""PGMB["ENDPOINT_POLICY"] on the external dispatcher's client: the check is on the address
connected to, after name resolution, and a refused address gets no packet.

Only loopback addresses ever receive traffic here: the policies deny 127.0.0.2 and allow
127.0.0.1, which gives real allowed and refused addresses; 169.254.169.254 is refused before
any socket is made."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from pgmb.dispatch.client import new_session, post
from tests.httpserver import RecordingServer

DENY_127_0_0_2 = {"ENDPOINT_POLICY": {"allow": ["127.0.0.1/32"], "deny": ["127.0.0.2/32"]}}


def send(loop, session, url: str) -> tuple:
    outcome = loop.run_until_complete(
        post(session, url, json.dumps({"n": 1}).encode(), {}, 2.0, 500)
    )
    return outcome.status, outcome.error


@pytest.fixture
def pair():
    """Servers on 127.0.0.1 and 127.0.0.2, on the same port."""
    allowed = RecordingServer("127.0.0.1").start()
    try:
        denied = RecordingServer("127.0.0.2", allowed.port).start()
    except OSError:
        allowed.stop()
        pytest.skip("the port is taken on 127.0.0.2")
    yield allowed, denied
    denied.stop()
    allowed.stop()


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_link_local_is_refused_by_default_before_connecting(loop, settings):
    settings.PGMB = {}
    session = new_session(4)
    status, error = send(loop, session, "http://169.254.169.254/latest/meta-data/")
    loop.run_until_complete(session.close())
    assert status is None
    assert error == (
        "connection failed: 169.254.169.254 resolves to 169.254.169.254, which "
        "PGMB['ENDPOINT_POLICY'] refuses"
    )


def test_a_denied_address_literal_gets_no_request(loop, settings, pair):
    allowed, denied = pair
    settings.PGMB = DENY_127_0_0_2
    session = new_session(4)
    assert send(loop, session, allowed.url("/a"))[0] == 200
    status, error = send(loop, session, denied.url("/b"))
    loop.run_until_complete(session.close())
    assert status is None and "127.0.0.2" in error and "refuses" in error
    assert [r.path for r in allowed.requests] == ["/a"]
    assert denied.requests == []


def test_an_answer_that_changes_is_checked_at_each_connect(loop, settings, pair):
    allowed, denied = pair
    settings.PGMB = DENY_127_0_0_2
    real = loop.getaddrinfo
    answers = iter(["127.0.0.1"])

    async def getaddrinfo(host, port, **kwargs):
        if host == "rebind.pgmb.test":
            host = next(answers, "127.0.0.2")
        return await real(host, port, **kwargs)

    loop.getaddrinfo = getaddrinfo  # the name's DNS answer, for this loop only
    url = f"http://rebind.pgmb.test:{allowed.port}/hook"
    session = new_session(4)
    assert send(loop, session, url)[0] == 200
    loop.run_until_complete(session.close())  # the next request connects anew

    status, error = send(loop, session, url)
    loop.run_until_complete(session.close())

    assert status is None
    assert error == (
        "connection failed: rebind.pgmb.test resolves to 127.0.0.2, which "
        "PGMB['ENDPOINT_POLICY'] refuses"
    )
    assert len(allowed.requests) == 1 and denied.requests == []


def test_of_several_addresses_only_the_allowed_are_tried(loop, settings, pair):
    allowed, denied = pair
    settings.PGMB = {"ENDPOINT_POLICY": {"deny": ["127.0.0.2/32"]}}

    async def getaddrinfo(host, port, **kwargs):
        # The refused address first: it would win a race it were allowed to enter.
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]

    loop.getaddrinfo = getaddrinfo
    session = new_session(4)
    status, _ = send(loop, session, f"http://two.pgmb.test:{allowed.port}/x")
    loop.run_until_complete(session.close())
    assert status == 200
    assert len(allowed.requests) == 1 and denied.requests == []


def test_several_allowed_addresses_are_raced(loop, settings, pair):
    allowed, _ = pair
    settings.PGMB = {"ENDPOINT_POLICY": {"deny": ["127.0.0.2/32"]}}

    async def getaddrinfo(host, port, **kwargs):
        # Nothing listens on 127.0.0.3: its attempt fails, the next one connects.
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.3", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]

    loop.getaddrinfo = getaddrinfo
    session = new_session(4)
    status, _ = send(loop, session, f"http://two.pgmb.test:{allowed.port}/x")
    loop.run_until_complete(session.close())
    assert status == 200 and len(allowed.requests) == 1
