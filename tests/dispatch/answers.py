"""Answers fed to the dispatcher's HTTP client a read at a time.

``read_answer`` makes a connection (``pgmb.dispatch.http1.Connection``) on one end of a real
socket pair, sends a request, and hands the protocol each piece of an answer as one read,
which the network would not let a test choose; then, if the answer is not whole, the other
end closes.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable

from pgmb.dispatch import http1

Read = tuple[http1.Response | Exception, bool]
REQUEST = b"POST / HTTP/1.1\r\nHost: test\r\nContent-Length: 2\r\n\r\n{}"


async def _read(pieces: Iterable[bytes], keep: int) -> Read:
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    with theirs:
        _, conn = await loop.create_connection(
            lambda: http1.Connection(("http", "test", 80), set()), sock=ours
        )
        waiter = conn.request(REQUEST, keep)
        for piece in pieces:
            conn.data_received(piece)  # past the answer, as the next read would be
        if not waiter.done():
            theirs.shutdown(socket.SHUT_WR)  # the worker ends the connection
        try:
            outcome: http1.Response | Exception = await asyncio.wait_for(waiter, 10)
        except http1.HttpError as exc:
            outcome = exc
        reusable = not conn.closed
        conn.abort()
        await asyncio.sleep(0)  # the transport closes on the next turn of the loop
    return outcome, reusable


def read_answer(
    pieces: Iterable[bytes], keep: int = 500
) -> tuple[http1.Response | Exception, bool]:
    """Feed ``pieces`` to a connection that sent a request, each as one read; then, if
    the answer is not yet whole, end the connection. The answer (or why there is none)
    and whether the connection would be kept."""
    return asyncio.run(_read(list(pieces), keep))
