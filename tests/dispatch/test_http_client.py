"""The external dispatcher's HTTP client (``pgmb.dispatch.http1``) against real servers that
answer oddly, and its outcomes (``pgmb.dispatch.client.post``).

What both transports share (keep-alive, closing servers, HTTP/1.0, limits) is in
``test_keepalive.py``; these are the answers well-behaved servers never send, TLS, URLs and
headers that cannot be sent, and giving up on a request.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import pytest

from pgmb.dispatch import http1
from pgmb.dispatch.client import new_session, post
from tests.closinghttp import OK, Raw, RawServer
from tests.httpserver import held

Post = Callable[..., tuple]


@pytest.fixture
def client() -> Iterator[tuple[asyncio.AbstractEventLoop, http1.Client]]:
    loop = asyncio.new_event_loop()
    session = new_session(64)
    yield loop, session
    loop.run_until_complete(session.close())
    loop.close()


@pytest.fixture
def send(client) -> Post:
    """POST one JSON body with the dispatcher's client; (status, error, retry_after)."""
    loop, session = client

    def call(url: str, body: object = None, timeout: float = 10.0, headers=None) -> tuple:
        outcome = loop.run_until_complete(
            post(session, url, json.dumps(body).encode(), headers or {}, timeout, 500)
        )
        return outcome.status, outcome.error, outcome.retry_after

    return call


def ports(server: RawServer) -> list[int]:
    return [handled.client_port for handled in server.handled]


def test_chunked_answers_are_read_to_the_end_and_keep_the_connection(send):
    chunked = (
        b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    with RawServer([chunked, chunked]) as server:
        outcomes = [send(server.url(), n) for n in range(3)]
    assert outcomes == [(500, "HTTP 500: hello world", None)] * 2 + [(200, "", None)]
    assert len(set(ports(server))) == 1


def test_interim_answers_are_skipped(send):
    interim = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 3\r\nContent-Length: 4\r\n\r\nbusy"
    )
    with RawServer([interim]) as server:
        outcomes = [send(server.url(), n) for n in range(2)]
    assert outcomes == [(503, "HTTP 503: busy", 3.0), (200, "", None)]
    assert len(set(ports(server))) == 1


def test_bare_line_feeds_and_missing_reasons_are_read(send):
    with RawServer([b"HTTP/1.1 404\nContent-Length: 2\n\nno"]) as server:
        outcomes = [send(server.url(), n) for n in range(2)]
    assert outcomes == [(404, "HTTP 404: no", None), (200, "", None)]
    assert len(set(ports(server))) == 1


def test_a_body_without_framing_ends_with_the_connection(send):
    with RawServer([Raw(b"HTTP/1.1 500 Oops\r\n\r\nthe end is the close", close=True)]) as server:
        outcomes = [send(server.url(), n) for n in range(2)]
    assert outcomes == [(500, "HTTP 500: the end is the close", None), (200, "", None)]
    assert len(set(ports(server))) == 2


def test_a_success_cut_short_still_counts(send):
    cut = Raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial", close=True)
    with RawServer([cut]) as server:
        outcomes = [send(server.url(), n) for n in range(2)]
    assert outcomes == [(200, "", None)] * 2
    assert len(set(ports(server))) == 2


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", id="bytes-after"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", id="close"
        ),
        pytest.param(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", id="http-1.0"),
        pytest.param(
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\nok\r\n0\r\n\r\n",
            id="http-1.0-chunked",  # RFC 9112 6.1: framing that cannot be trusted
        ),
    ],
)
def test_answers_that_forbid_reuse_cost_their_connection(send, answer):
    with RawServer([answer]) as server:
        outcomes = [send(server.url(), n) for n in range(2)]
    assert outcomes == [(200, "", None)] * 2
    assert len(set(ports(server))) == 2


def test_an_http_10_server_that_keeps_alive_keeps_its_connection(send):
    kept = b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n"
    with RawServer([kept, kept]) as server:
        outcomes = [send(server.url(), n) for n in range(3)]
    assert outcomes == [(200, "", None)] * 3
    assert len(set(ports(server))) == 1


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"ICY 200 OK\r\n\r\n", "Expected HTTP/"),
        (b"HTTP/2 200\r\n\r\n", "Expected dot"),
        (b"HTTP/2.0 200 OK\r\n\r\n", "HTTP/2.0 is not HTTP/1.x"),
        (b"HTTP/0.9 200 OK\r\n\r\n", "HTTP/0.9 is not HTTP/1.x"),
        (b"HTTP/1.2 200 OK\r\n\r\n", "Invalid HTTP version"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "Invalid response status"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "Invalid header token"),
        (b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n", "Unexpected space after start line"),
        (b"HTTP/1.1 200 OK\r\nName : x\r\n\r\n", "Invalid header token"),
        (b"HTTP/1.1 200 OK\r\nX: a\rb\r\nContent-Length: 0\r\n\r\n", "Missing expected LF"),
        (b"HTTP/1.1 200 OK\rContent-Length: 0\r\n\r\n", "Expected LF after CR"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
            "Duplicate Content-Length",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Invalid character in Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok", "Invalid character in Content-Length"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",
            "Content-Length overflow",
        ),
        (
            # RFC 9112 6.3: a sign of request smuggling or of a broken proxy.
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
            b"2\r\nok\r\n0\r\n\r\n",
            "Content-Length can't be present with Transfer-Encoding",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "Invalid character in chunk size",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokay\r\n",
            "Expected LF after chunk data",
        ),
        (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "101 Switching Protocols, never asked for"),
        (b"HTTP/1.1 099 Odd\r\n\r\n", "status 99"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000, "a response head over 65536 bytes"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: " + b"a" * 70_000,
            "a response head over 65536 bytes",
        ),
        (Raw(b"HTTP/1.1 200 O", close=True), "the connection ended in the middle of the head"),
    ],
)
def test_malformed_answers_are_outcomes_that_cost_only_their_connection(send, answer, error):
    with RawServer([answer]) as server:
        broken, after = (send(server.url(), n) for n in range(2))
    status, reason, retry_after = broken
    assert status is None and retry_after is None
    assert reason.startswith(f"invalid response from the worker: {error}")
    assert after == (200, "", None)
    assert len(set(ports(server))) == 2


def test_a_timeout_in_the_middle_of_a_body_costs_its_connection(send):
    slow = b"HTTP/1.1 500 Oops\r\nContent-Length: 100\r\n\r\nthe rest never comes"
    with RawServer([slow]) as server:
        outcomes = [send(server.url(), n, timeout=0.3) for n in range(2)]
    assert outcomes == [(None, "timeout after 0.3s", None), (200, "", None)]
    assert len(set(ports(server))) == 2


def test_headers_that_would_break_the_request_are_refused_and_nothing_is_sent(send):
    with RawServer() as server:
        injected = send(server.url(), 1, headers={"X-Evil": "a\r\nInjected: yes"})
        accented = send(server.url(), 2, headers={"X-Name": "é"})
        fine = send(server.url(), 3, headers={"X-Name": "e"})
        handled = server.handled
    assert injected == (
        None,
        "pgmb's own failure: could not send the request: "
        "a header name or value holds a line break or a NUL",
        None,
    )
    assert accented[0] is None
    assert accented[1].startswith("pgmb's own failure: could not send the request: ")
    assert fine == (200, "", None)
    assert [json.loads(h.body) for h in handled] == [3]


def test_what_the_url_decides_reaches_the_server(send):
    with RawServer() as server:
        url = f"http://us%40er:pa%3Ass@127.0.0.1:{server.port}/h%C3%A9/é?q=a b&x=ü#fragment"
        assert send(url, 1) == (200, "", None)
        head = server.heads[0].decode("ascii")
    request_line, *lines = head.split("\r\n")
    assert request_line == "POST /h%C3%A9/%C3%A9?q=a%20b&x=%C3%BC HTTP/1.1"
    assert f"Host: 127.0.0.1:{server.port}" in lines
    assert f"Authorization: Basic {base64.b64encode(b'us@er:pa:ss').decode()}" in lines
    assert "Content-Length: 1" in lines
    assert "User-Agent: pgmb-dispatcher" in lines


@pytest.mark.parametrize(
    ("url", "key", "target", "host"),
    [
        ("http://Example.COM/x", ("http", "example.com", 80), "/x", "example.com"),
        ("HTTPS://example.com:443", ("https", "example.com", 443), "/", "example.com"),
        ("https://example.com:8443/?", ("https", "example.com", 8443), "/", "example.com:8443"),
        ("http://[::1]:8080/a?b=c", ("http", "::1", 8080), "/a?b=c", "[::1]:8080"),
        ("http://bücher.example/", ("http", "xn--bcher-kva.example", 80), "/",
         "xn--bcher-kva.example"),
    ],
)  # fmt: skip
def test_urls_are_parsed_into_where_to_connect_and_the_request_line(url, key, target, host):
    endpoint = http1.parse_endpoint(url)
    assert endpoint.key == key
    assert endpoint.head == f"POST {target} HTTP/1.1\r\nHost: {host}\r\n"
    assert (endpoint.host, endpoint.port, endpoint.tls) == (key[1], key[2], key[0] == "https")


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("ftp://example.com/", "unknown url type: 'ftp://example.com/'"),
        ("http:///only/a/path", "no host given"),
        ("http://example.com:99999/", "out of range"),
        ("http://example.com/a\r\nInjected: yes", "a line break or a NUL in the URL"),
    ],
)
def test_urls_that_cannot_be_posted_to_are_refused(url, error):
    with pytest.raises(ValueError, match=error):
        http1.parse_endpoint(url)


def test_a_refused_connection_names_the_reason_and_the_address(send):
    status, error, _ = send("http://127.0.0.1:9/")
    assert (status, error) == (None, "connection failed: Connection refused (127.0.0.1:9)")


def test_a_connection_that_is_never_accepted_times_out(send):
    # A listener whose accept queue is full: the kernel leaves further handshakes waiting.
    with socket.create_server(("127.0.0.1", 0), backlog=0) as listener:
        port = listener.getsockname()[1]
        queued = []
        try:
            for _ in range(4):  # the queue's one place, and then some
                sock = socket.socket()
                sock.setblocking(False)
                sock.connect_ex(("127.0.0.1", port))
                queued.append(sock)
            outcome = send(f"http://127.0.0.1:{port}/", timeout=0.3)
        finally:
            for sock in queued:
                sock.close()
    assert outcome == (None, "timeout after 0.3s", None)


def test_a_cancelled_request_costs_its_connection_and_nothing_else(client, recording_server):
    loop, session = client
    gate = threading.Event()
    recording_server.script([held(gate)])
    url = recording_server.url()

    async def cancel_while_held() -> None:
        task = asyncio.ensure_future(post(session, url, b"1", {}, 10, 500))
        await asyncio.to_thread(recording_server.wait_for, 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        loop.run_until_complete(cancel_while_held())
    finally:
        gate.set()
    after = loop.run_until_complete(post(session, url, b"2", {}, 10, 500))
    assert after.ok
    held_request, next_request = recording_server.wait_for(2)
    assert held_request.peer != next_request.peer


@pytest.mark.parametrize(("kept", "connections"), [(1, 6), (2, 2)])
def test_idle_connections_past_the_bound_are_closed_least_recently_used_first(
    make_recording_server, kept, connections
):
    servers = [make_recording_server() for _ in range(2)]
    loop = asyncio.new_event_loop()
    session = http1.Client(kept=kept)
    try:
        for n in range(6):
            response = loop.run_until_complete(session.post(servers[n % 2].url(), b"{}", {}, 10, 0))
            assert response.status == 200
    finally:
        loop.run_until_complete(session.close())
        loop.close()
    peers = {request.peer for server in servers for request in server.wait_for(3)}
    assert len(peers) == connections


def test_a_large_body_arrives_intact(send, recording_server):
    payload = {"blob": "x" * (4 << 20)}
    assert send(recording_server.url(), payload) == (200, "", None)
    (received,) = recording_server.wait_for(1)
    assert received.json() == payload


def test_https_keeps_its_connection_and_checks_the_certificate(certificate):
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(certificate)
    loop = asyncio.new_event_loop()
    trusting = http1.Client(ssl_context=ssl.create_default_context(cafile=str(certificate)))
    default = new_session(4)
    try:
        with RawServer(
            [OK, b"HTTP/1.1 500 No\r\nContent-Length: 2\r\n\r\nno"], server_context
        ) as server:
            url = server.url(scheme="https")
            outcomes = [
                loop.run_until_complete(post(trusting, url, b"{}", {}, 10, 500)) for _ in range(3)
            ]
            refused = loop.run_until_complete(post(default, url, b"{}", {}, 10, 500))
    finally:
        for session in (trusting, default):
            loop.run_until_complete(session.close())
        loop.close()
    assert [(o.status, o.error) for o in outcomes] == [(200, ""), (500, "HTTP 500: no"), (200, "")]
    assert len(set(ports(server))) == 1
    assert refused.status is None
    assert refused.error.startswith("connection failed: [SSL: CERTIFICATE_VERIFY_FAILED]")
