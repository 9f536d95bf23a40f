"""How the dispatcher's HTTP client (``pgmb.dispatch.http1``) reads answers that arrive in
pieces, are too large, or come from a name with a dead address.

Most answers are fed to a connection a read at a time (``tests.dispatch.answers``).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import httptools
import pytest

from pgmb.dispatch import http1
from pgmb.dispatch.client import new_session, post
from tests.closinghttp import OK, Raw, RawServer
from tests.dispatch.answers import read_answer


class CountingParser(httptools.HttpResponseParser):
    """httptools' parser, counting what it is fed."""

    feeds: list[int] = []

    def feed_data(self, data) -> None:  # type: ignore[no-untyped-def]
        CountingParser.feeds.append(len(data))
        super().feed_data(data)


@pytest.fixture
def feeds(monkeypatch) -> Iterator[list[int]]:
    """The size of each piece the connections made in the test feed their parser."""
    CountingParser.feeds = []
    monkeypatch.setattr(httptools, "HttpResponseParser", CountingParser)
    yield CountingParser.feeds


def test_a_head_sent_a_byte_at_a_time_is_fed_a_line_at_a_time(feeds):
    head = b"HTTP/1.1 500 Oops\r\n" + b"".join(
        b"X-Header-%d: %s\r\n" % (n, b"v" * 2000) for n in range(30)
    )
    answer = head + b"Content-Length: 4\r\n\r\nbody"
    response, reusable = read_answer(answer[i : i + 1] for i in range(len(answer)))
    assert response == http1.Response(
        500, {**{f"x-header-{n}": "v" * 2000 for n in range(30)}, "content-length": "4"}, b"body"
    )
    assert reusable
    # Each byte fed once, and the head whole lines at a time (httptools would copy a line
    # split across feeds once for each piece): linear in the answer's size.
    assert sum(feeds) == len(answer)
    lines = head.count(b"\n") + 2
    assert len(feeds) == lines + len(b"body")


def test_trailers_sent_a_byte_at_a_time_are_fed_a_line_at_a_time(feeds):
    head = b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n"
    trailers = b"".join(b"X-Trailer-%d: %s\r\n" % (n, b"t" * 2000) for n in range(10)) + b"\r\n"
    answer = head + b"4\r\nbody\r\n0\r\n" + trailers
    response, reusable = read_answer(answer[i : i + 1] for i in range(len(answer)))
    assert isinstance(response, http1.Response) and response.body == b"body"
    assert reusable
    assert sum(feeds) == len(answer)
    # Bytes one at a time until the first trailer byte shows it is not chunk data, then
    # a line at a time.
    assert len(feeds) < len(head + b"4\r\nbody\r\n0\r\n") + 2 + trailers.count(b"\n")


def test_an_answer_trickled_over_the_network_is_read():
    trickled = Raw(
        b"HTTP/1.1 503 Busy\r\nRetry-After: 5\r\n" + b"X-Pad: %s\r\n" % (b"p" * 3000)
        + b"Content-Length: 4\r\n\r\nbusy",
        trickle=True,
    )  # fmt: skip
    loop = asyncio.new_event_loop()
    session = new_session(4)
    try:
        with RawServer([trickled]) as server:
            outcomes = [
                loop.run_until_complete(post(session, server.url(), b"{}", {}, 30, 500))
                for _ in range(2)
            ]
    finally:
        loop.run_until_complete(session.close())
        loop.close()
    assert [(o.status, o.error, o.retry_after) for o in outcomes] == [
        (503, "HTTP 503: busy", 5.0),
        (200, "", None),
    ]
    assert len({handled.client_port for handled in server.handled}) == 1


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(
            b"HTTP/1.1 200 OK\r\n" + b"X-Padding: %s\r\n" % (b"a" * 1000) * 300 + b"\r\n",
            id="300-KiB-of-headers",
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 300_000 + b"\r\n\r\n", id="one-line"),
        pytest.param(b"HTTP/1.1 200 " + b"A" * 300_000 + b"\r\n\r\n", id="reason"),
    ],
)
def test_a_head_over_the_limit_in_one_read_is_refused(head):
    response, reusable = read_answer([head + b"Content-Length: 0\r\n\r\n"])
    assert isinstance(response, http1.BadResponse)
    assert str(response) == f"a response head over {http1.HEAD_LIMIT} bytes"
    assert not reusable


@pytest.mark.parametrize(
    ("answer", "status", "body", "reusable"),
    [
        (OK + b"EXTRA", 200, b"", False),
        (b"HTTP/1.1 500 No\r\nContent-Length: 2\r\n\r\nno" + OK, 500, b"no", False),
        (b"HTTP/1.1 500 No\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nno\r\n0\r\n\r\nX", 500,
         b"no", False),
        (b"HTTP/1.1 500 Until the end\r\n\r\nof the connection", 500, b"of the connection", False),
        (b"HTTP/1.1 500 No\r\nContent-Length: 9\r\n\r\ncut", 500, b"cut", False),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", 200, b"",
         True),
        (b"HTTP/1.0 500 No\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
         b"2\r\nno\r\n0\r\n\r\n", 500, b"no", False),
    ],
)  # fmt: skip
@pytest.mark.parametrize("split", ["whole", "bytes"])
def test_how_an_answer_ends_decides_whether_its_connection_is_kept(
    answer, status, body, reusable, split
):
    pieces = [answer] if split == "whole" else [answer[i : i + 1] for i in range(len(answer))]
    response, kept = read_answer(pieces)
    assert isinstance(response, http1.Response)
    assert (response.status, response.body, kept) == (status, body, reusable)


def test_a_body_past_the_drain_limit_is_answered_and_costs_the_connection():
    answer = b"HTTP/1.1 500 Big\r\nContent-Length: %d\r\n\r\n" % (2 * http1.DRAIN_LIMIT)
    pieces = [answer] + [b"x" * 65536] * (http1.DRAIN_LIMIT // 65536 + 1)
    response, reusable = read_answer(pieces, keep=10)
    assert response == http1.Response(
        500, {"content-length": str(2 * http1.DRAIN_LIMIT)}, b"x" * 10
    )
    assert not reusable


# --- a name with a dead IPv6 address ---


def _ipv6_loopback() -> bool:
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6):
            return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
def test_a_dual_stack_name_whose_ipv6_address_is_dead_is_reached_over_ipv4(monkeypatch):
    """``dual-stack.test`` resolves to ::1 first, then 127.0.0.1 (a stub of the name
    lookup only). On ::1 a listener with a full accept queue never completes a handshake."""
    with (
        RawServer() as server,
        socket.create_server(("::1", 0), family=socket.AF_INET6, backlog=0) as dead,
    ):
        dead_port = dead.getsockname()[1]
        queued = []
        try:
            for _ in range(4):  # the queue's one place, and then some
                sock = socket.socket(socket.AF_INET6)
                sock.setblocking(False)
                sock.connect_ex(("::1", dead_port))
                queued.append(sock)
            loop = asyncio.new_event_loop()

            async def getaddrinfo(host, port, **kwargs):  # type: ignore[no-untyped-def]
                assert host == "dual-stack.test"
                tcp = (socket.SOCK_STREAM, socket.IPPROTO_TCP, "")
                return [
                    (socket.AF_INET6, *tcp, ("::1", dead_port, 0, 0)),
                    (socket.AF_INET, *tcp, ("127.0.0.1", server.port)),
                ]

            monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
            session = new_session(4)
            try:
                url = f"http://dual-stack.test:{server.port}/"
                outcome = loop.run_until_complete(post(session, url, b"{}", {}, 10, 500))
            finally:
                loop.run_until_complete(session.close())
                loop.close()
        finally:
            for sock in queued:
                sock.close()
    assert (outcome.status, outcome.error) == (200, "")
    assert len(server.handled) == 1
