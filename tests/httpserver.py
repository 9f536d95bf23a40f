"""A real HTTP server for tests that records every request and answers as scripted.

``RecordingServer`` listens on 127.0.0.1 on a free port and runs aiohttp's low-level server
on its own event loop in a background thread, so synchronous tests, the dispatcher under
test and PostgreSQL's ``http`` extension can all reach it while the test thread inspects
what arrived. It answers hundreds of concurrent connections and thousands of requests per
second, which lets delivery tests and benchmarks use it as an endpoint.

    with RecordingServer() as server:
        server.script([500, retry_after(2), reply(200, {"ok": True})])
        ...  # deliver to server.url("/hook")
        first, second, third = server.wait_for(3)
        assert first.json() == {...} and first.headers["content-type"] == "application/json"

How a request is answered, first match wins: the queue of scripted replies for its path,
the queue of scripted replies for any path, the default reply for its path, the default
reply (200 with an empty body unless changed by ``respond``). A reply can also close the
connection without answering (``reset()`` sends a TCP RST, ``hangup()`` a FIN) and can
wait before answering (``delay``, or ``slow()``), or until the test lets it (``held()``).

The fixtures ``recording_server`` and ``make_recording_server`` at the bottom give tests a
started server that is stopped after the test.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import parse_qsl

import pytest
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from tests.waiting import DEADLINE

Action = Literal["respond", "reset", "close"]


@dataclass(frozen=True)
class Reply:
    """What the server does with one request.

    ``body`` may be bytes (sent as is), str (sent as UTF-8 text/plain) or anything else
    JSON can encode (sent as application/json); a Content-Type in ``headers`` wins.
    ``action`` is "respond", "reset" (abort the connection with a TCP RST, no answer) or
    "close" (close it with a FIN, no answer). ``delay`` seconds pass before any of these,
    and, with a ``gate``, they wait until the test sets it (``held()``).
    """

    status: int = 200
    body: Any = b""
    headers: Mapping[str, str] | None = None
    delay: float = 0.0
    action: Action = "respond"
    gate: threading.Event | None = None

    def to_response(self) -> web.Response:
        """The aiohttp response for this reply (``action`` "respond" only)."""
        headers = CIMultiDict(self.headers or {})
        if isinstance(self.body, bytes | bytearray):
            payload = bytes(self.body)
        elif isinstance(self.body, str):
            payload = self.body.encode()
            headers.setdefault("Content-Type", "text/plain; charset=utf-8")
        elif self.body is None:
            payload = b""
        else:
            payload = json.dumps(self.body).encode()
            headers.setdefault("Content-Type", "application/json")
        return web.Response(status=self.status, body=payload, headers=headers)


def reply(
    status: int = 200,
    body: Any = b"",
    headers: Mapping[str, str] | None = None,
    delay: float = 0.0,
) -> Reply:
    """An answer with this status, body and headers, sent after ``delay`` seconds."""
    return Reply(status=status, body=body, headers=headers, delay=delay)


def reset(delay: float = 0.0) -> Reply:
    """Abort the connection with a TCP RST instead of answering (clients see a reset)."""
    return Reply(status=0, delay=delay, action="reset")


def hangup(delay: float = 0.0) -> Reply:
    """Close the connection without answering (clients see an empty reply)."""
    return Reply(status=0, delay=delay, action="close")


def retry_after(seconds: int | str, status: int = 429, body: Any = b"") -> Reply:
    """A 429 (or ``status``) carrying ``Retry-After: seconds`` (seconds or an HTTP date)."""
    return Reply(status=status, body=body, headers={"Retry-After": str(seconds)})


def slow(delay: float, status: int = 200, body: Any = b"") -> Reply:
    """An answer that only starts after ``delay`` seconds (for timeout tests)."""
    return Reply(status=status, body=body, delay=delay)


def held(gate: threading.Event, status: int = 200, body: Any = b"") -> Reply:
    """An answer sent only once ``gate`` is set: the request stays in flight until then."""
    return Reply(status=status, body=body, gate=gate)


@dataclass(frozen=True)
class Record:
    """One request as the server received it."""

    method: str
    path: str  # decoded, without the query string
    query_string: str  # as sent, still percent-encoded
    headers: CIMultiDictProxy[str]  # case-insensitive: headers["content-type"]
    body: bytes
    received_at: float  # time.monotonic() when the request arrived
    received_wall: float  # time.time() when the request arrived
    peer: tuple[str, int] | None  # the client's address: tells connections apart
    reply: Reply | None = None  # what the server answered (or did) in return

    def json(self) -> Any:
        """The body decoded as JSON."""
        return json.loads(self.body)

    def text(self) -> str:
        """The body decoded as UTF-8."""
        return self.body.decode()

    def form(self) -> dict[str, str]:
        """The body decoded as application/x-www-form-urlencoded (last value wins)."""
        return dict(parse_qsl(self.body.decode(), keep_blank_values=True))

    @property
    def query(self) -> dict[str, str]:
        """The query string decoded (last value wins)."""
        return dict(parse_qsl(self.query_string, keep_blank_values=True))


Responder = Callable[[Record], "Reply | int"]
Scripted = Reply | int | Responder


def _as_reply(item: Scripted, record: Record) -> Reply:
    """Resolve a scripted item (a Reply, a bare status, or a function of the request)."""
    if callable(item) and not isinstance(item, Reply):
        item = item(record)
    if isinstance(item, int):
        return Reply(status=item)
    if isinstance(item, Reply):
        return item
    raise TypeError(f"a scripted reply must be a Reply, an int or a callable, not {item!r}")


class RecordingServer:
    """An HTTP server on 127.0.0.1 that records requests and answers as scripted.

    Every method may be called from any thread. ``start``/``stop`` or ``with`` run it.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, backlog: int = 1024) -> None:
        self.host = host
        self.port = port
        self._backlog = backlog
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._records: list[Record] = []
        self._default: Scripted = Reply()
        self._path_defaults: dict[str, Scripted] = {}
        self._queue: deque[Scripted] = deque()
        self._path_queues: dict[str, deque[Scripted]] = {}
        self._in_flight = 0
        self._max_in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> RecordingServer:
        """Bind, start serving in a background thread and return once it accepts requests."""
        if self._thread is not None:
            return self
        # Binding here, before the thread starts, makes the port known and a bind error
        # surface in the caller.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []
        self._loop = loop
        self._thread = threading.Thread(
            target=self._serve,
            args=(loop, sock, ready, failure),
            name=f"RecordingServer:{self.port}",
            daemon=True,
        )
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = self._loop = None
            raise failure[0]
        return self

    def stop(self) -> None:
        """Stop serving and close the port; requests still being answered are cut off."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._thread = self._loop = None

    def __enter__(self) -> RecordingServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _serve(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        ready: threading.Event,
        failure: list[BaseException],
    ) -> None:
        asyncio.set_event_loop(loop)
        runner: web.ServerRunner | None = None

        async def setup() -> web.ServerRunner:
            # access_log=None: logging every request would cost more than answering it.
            server = web.Server(self._handle, access_log=None)
            # A short shutdown_timeout: stop() should not wait for slow replies to finish.
            started = web.ServerRunner(server, shutdown_timeout=0.1)
            await started.setup()
            await web.SockSite(started, sock, backlog=self._backlog).start()
            return started

        try:
            runner = loop.run_until_complete(setup())
        except BaseException as exc:
            failure.append(exc)
            sock.close()
            loop.close()
            ready.set()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    # --- scripting ------------------------------------------------------------------------

    def url(self, path: str = "/") -> str:
        """The absolute URL of ``path`` on this server."""
        if not path.startswith("/"):
            path = "/" + path
        return f"http://{self.host}:{self.port}{path}"

    def respond(
        self,
        status: int | Reply | Responder = 200,
        body: Any = b"",
        headers: Mapping[str, str] | None = None,
        delay: float = 0.0,
        *,
        path: str | None = None,
    ) -> None:
        """Set the default reply (for ``path`` only, when given).

        ``status`` may also be a ready ``Reply`` or a function of the ``Record`` returning
        one (or a bare status), which then answers every such request.
        """
        item: Scripted = (
            status
            if isinstance(status, Reply) or callable(status)
            else Reply(status=status, body=body, headers=headers, delay=delay)
        )
        with self._lock:
            if path is None:
                self._default = item
            else:
                self._path_defaults[path] = item

    def script(self, replies: Iterable[Scripted], *, path: str | None = None) -> None:
        """Queue replies used once each, in order, before falling back to the defaults.

        Items are ``Reply`` objects, bare statuses (``500``) or functions of the ``Record``.
        With ``path`` the queue applies to that path only (and is used before the queue
        for any path).
        """
        with self._lock:
            if path is None:
                self._queue.extend(replies)
            else:
                self._path_queues.setdefault(path, deque()).extend(replies)

    def scripted_left(self, path: str | None = None) -> int:
        """How many scripted replies (for any path, or for ``path``) are still queued."""
        with self._lock:
            if path is None:
                return len(self._queue)
            return len(self._path_queues.get(path, ()))

    # --- what arrived ---------------------------------------------------------------------

    @property
    def requests(self) -> list[Record]:
        """A snapshot of the requests received so far, in order of arrival."""
        with self._lock:
            return list(self._records)

    def clear(self) -> None:
        """Forget the requests received so far (scripts and defaults stay)."""
        with self._lock:
            self._records.clear()

    def wait_for(self, n: int, timeout: float = DEADLINE) -> list[Record]:
        """Block until at least ``n`` requests have arrived; return them all.

        Raises TimeoutError, saying how many arrived, after ``timeout`` seconds.
        """
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self._records) >= n, timeout):
                raise TimeoutError(
                    f"{len(self._records)} request(s) arrived at {self.url()} within "
                    f"{timeout} s, expected {n}"
                )
            return list(self._records)

    @property
    def in_flight(self) -> int:
        """Requests received and not yet answered."""
        with self._lock:
            return self._in_flight

    @property
    def max_in_flight(self) -> int:
        """The most requests that were being answered at the same time."""
        with self._lock:
            return self._max_in_flight

    # --- serving --------------------------------------------------------------------------

    def _choose(self, path: str) -> Scripted:
        """The reply for the next request to ``path`` (called with the lock held)."""
        queue = self._path_queues.get(path)
        if queue:
            return queue.popleft()
        if self._queue:
            return self._queue.popleft()
        return self._path_defaults.get(path, self._default)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        received_at, received_wall = time.monotonic(), time.time()
        # request.content has no size limit, unlike request.read() (1 MiB by default).
        body = await request.content.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        record = Record(
            method=request.method,
            path=request.path,
            query_string=request.rel_url.raw_query_string,
            headers=CIMultiDictProxy(CIMultiDict(request.headers)),
            body=body,
            received_at=received_at,
            received_wall=received_wall,
            peer=tuple(peer[:2]) if peer else None,
        )
        with self._lock:
            item = self._choose(request.path)
        # A responder runs outside the lock so that it may call this server's methods.
        answer = _as_reply(item, record)
        with self._arrived:
            self._records.append(replace(record, reply=answer))
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            self._arrived.notify_all()
        try:
            while answer.gate is not None and not answer.gate.is_set():
                await asyncio.sleep(0.01)
            if answer.delay > 0:
                await asyncio.sleep(answer.delay)
            if answer.action == "respond":
                return answer.to_response()
            transport = request.transport
            if transport is not None:
                if answer.action == "reset":
                    # SO_LINGER with a zero timeout turns the close into a TCP RST.
                    raw = transport.get_extra_info("socket")
                    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    transport.abort()
                else:
                    transport.close()
            # aiohttp ends a connection's handling quietly on cancellation, and there is no
            # answer to send on a closed connection.
            raise asyncio.CancelledError
        finally:
            with self._lock:
                self._in_flight -= 1


@pytest.fixture
def recording_server() -> Iterator[RecordingServer]:
    """A started RecordingServer, stopped after the test."""
    with RecordingServer() as server:
        yield server


@pytest.fixture
def make_recording_server() -> Iterator[Callable[[], RecordingServer]]:
    """A factory of started RecordingServers (for tests needing several endpoints)."""
    servers: list[RecordingServer] = []

    def make() -> RecordingServer:
        server = RecordingServer().start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()
