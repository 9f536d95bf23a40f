"""HTTP/1.1 POSTs over pooled keep-alive connections, on asyncio's protocols.

The external dispatcher's HTTP client. It needs one narrow thing: a POST whose headers are
already checked (:func:`pgmb.dispatch.request.build_headers`), the answer's status, its
headers and the first bytes of its body. aiohttp did this at two to three times the CPU a
request (builders, multidicts, cookie and tracing hooks, tasks of its own), and that cost
bounded the dispatcher's throughput (docs/benchmarks.md, docs/decisions.md).

Its keep-alive rules are the PL/Python transport's (``pgmb.load_plpython_transport`` in
SQL), and one table of tests runs both (``tests/dispatch/test_keepalive.py``):

* a connection is kept when the answer said nothing against it (``Connection: close``,
  HTTP/1.0 without ``keep-alive``, a body that ends with the connection) and its body was
  read to the end within :data:`DRAIN_LIMIT`; past that, closing costs less than reading on;
* an idle connection the server closed is dropped when found. A request whose kept
  connection ends before any byte of an answer is sent once more on a new connection:
  the server most likely closed it as the request went out (at-least-once: should it have
  handled the request, a duplicate);
* at most ``kept`` idle connections are held, the least recently used closed first.

Answers are read as RFC 9112 says: interim 1xx answers are skipped; Transfer-Encoding
wins over Content-Length (and the connection is then not kept); no framing at all means
the body ends with the connection. Anything else malformed is :class:`BadResponse`, and the
connection is closed.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

#: Body bytes read past what the caller keeps, to reuse the connection; beyond, it closes.
DRAIN_LIMIT = 1 << 20
#: An answer's status line and headers may take this many bytes, as aiohttp allowed.
HEAD_LIMIT = 64 * 1024
#: Parsed URLs kept; the cache is emptied past this many (endpoints rarely change).
_ENDPOINT_CACHE = 1000

#: What may not appear in a request's head other than at a line's end.
_UNSAFE = re.compile(r"[\x00\r\n]")
_HEAD_END = re.compile(rb"\n\r?\n")
_STATUS_LINE = re.compile(r"HTTP/1\.([01]) ([0-9]{3})(?:[ \t][^\x00-\x08\x0a-\x1f\x7f]*)?")
_CHUNK_SIZE = re.compile(rb"[ \t]*([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?")
#: RFC 3986 characters a path and a query keep as they are; others are percent-encoded.
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_QUERY_SAFE = _PATH_SAFE + "?"


class HttpError(Exception):
    """The request got no usable HTTP answer."""


class ConnectError(HttpError):
    """No connection could be made (name lookup, refusal, TLS handshake or certificate)."""


class NoResponse(HttpError):
    """The connection ended before any byte of an answer."""


class BadResponse(HttpError):
    """The answer broke HTTP/1.1; the connection was closed."""


@dataclass(frozen=True)
class Response:
    """An answer: its status, its headers (lower-case names; repeated ones joined with
    ``", "``) and the first bytes of its body, as many as the caller asked to keep."""

    status: int
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True)
class _Endpoint:
    """A URL made ready to connect to and to address."""

    key: tuple[str, str, int]
    host: str
    port: int
    tls: bool
    #: The request line and the headers the URL decides (Host, Authorization).
    head: str


def parse_endpoint(url: str) -> _Endpoint:
    """``url`` ready to connect to; ``ValueError`` for what cannot be posted to.

    The texts of the first two errors are the PL/Python transport's. Non-ASCII host names
    are IDNA-encoded, a path and a query percent-encoded where they must be, and the
    fragment dropped; a user and password in the URL become Basic credentials.
    """
    if _UNSAFE.search(url):
        raise ValueError(f"a line break or a NUL in the URL {url!r}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"unknown url type: {url!r}")
    host = parts.hostname
    if not host:
        raise ValueError(f"no host given: {url!r}")
    tls = scheme == "https"
    default = 443 if tls else 80
    port = parts.port or default  # .port raises ValueError for a port out of range
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise ValueError(f"invalid host name in {url!r}: {exc}") from None
    authority = f"[{host}]" if ":" in host else host
    if port != default:
        authority += f":{port}"
    target = quote(parts.path or "/", safe=_PATH_SAFE)
    if parts.query:
        target += "?" + quote(parts.query, safe=_QUERY_SAFE)
    head = f"POST {target} HTTP/1.1\r\nHost: {authority}\r\n"
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        head += f"Authorization: Basic {base64.b64encode(credentials.encode()).decode()}\r\n"
    return _Endpoint((scheme, host, port), host, port, tls, head)


def _parse_head(head: bytes) -> tuple[int, bool, dict[str, str]]:
    """An answer's status, whether it is HTTP/1.0, and its headers."""
    lines = head.decode("latin-1").split("\n")
    status_line = lines[0].rstrip("\r")
    match = _STATUS_LINE.fullmatch(status_line)
    if match is None:
        raise BadResponse(f"not an HTTP/1.x status line: {status_line[:60]!r}")
    headers: dict[str, str] = {}
    for raw in lines[1:]:
        line = raw.rstrip("\r")
        name, colon, value = line.partition(":")
        # No blank before the colon, no folded lines (RFC 9112 5.1, 5.2).
        if not colon or not name or name != name.strip(" \t"):
            raise BadResponse(f"a malformed header line: {line[:60]!r}")
        name = name.lower()
        value = value.strip(" \t")
        before = headers.get(name)
        if before is None:
            headers[name] = value
        elif name == "content-length":
            if before != value:
                raise BadResponse("two different Content-Length headers")
        else:
            headers[name] = f"{before}, {value}"
    return int(match[2]), match[1] == "0", headers


class _Connection(asyncio.Protocol):
    """One connection: sends a request, parses its answer, fails its waiter if it ends."""

    def __init__(self, key: tuple[str, str, int], registry: set[_Connection]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._registry = registry
        self._buffer = bytearray()
        self._waiter: asyncio.Future[Response] | None = None
        self._keep = 0
        self._reset()

    def _reset(self) -> None:
        self._received = False
        self._status = 0
        self._headers: dict[str, str] = {}
        self._reusable = True
        #: "length", "chunked" or "close" (the body ends with the connection).
        self._mode = ""
        #: Body bytes still due ("length"); in "chunked", the current chunk's bytes still
        #: due, or -1 (a size line is next), -2 (the CRLF after a chunk), -3 (trailers).
        self._remaining = 0
        self._body = bytearray()
        self._drained = 0

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._registry.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._registry.discard(self)
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._status:
            # The answer came: a body that ends with the connection ends here, one cut
            # short only costs the connection.
            self._finish(reusable=False)
        elif self._received:
            waiter.set_exception(BadResponse("the connection ended in the middle of the head"))
        else:
            waiter.set_exception(NoResponse(str(exc) if exc else "closed by the server"))

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            # Bytes nobody asked for (or for a request given up): the connection's framing
            # can no longer be trusted.
            self.abort()
            return
        self._received = True
        self._buffer += data
        try:
            self._parse()
        except BadResponse as exc:
            waiter.set_exception(exc)
            self.abort()

    # --- used by the client ---

    def request(self, data: bytes, keep: int) -> asyncio.Future[Response]:
        """Send one request; the future gets its answer or the reason there is none."""
        assert self.transport is not None and self._waiter is None
        self._waiter = asyncio.get_running_loop().create_future()
        self._keep = keep
        self.transport.write(data)
        return self._waiter

    def expire(self) -> None:
        """The request's time is up: its waiter gets TimeoutError, the connection ends."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(asyncio.TimeoutError())
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # --- parsing ---

    def _parse(self) -> None:
        buffer = self._buffer
        while not self._status:
            end = _HEAD_END.search(buffer)
            if end is None:
                if len(buffer) > HEAD_LIMIT:
                    raise BadResponse(f"a response head over {HEAD_LIMIT} bytes")
                return
            head = bytes(buffer[: end.start()])
            del buffer[: end.end()]
            status, http10, headers = _parse_head(head)
            if status < 100:
                raise BadResponse(f"status {status}")
            if status < 200:
                if status == 101:
                    raise BadResponse("101 Switching Protocols, never asked for")
                continue  # interim; the final answer follows
            self._start_body(status, http10, headers)
        if self._mode == "length":
            taken = min(len(buffer), self._remaining)
            self._remaining -= taken
            if self._absorb(buffer, taken) and not self._remaining:
                self._finish(self._reusable)
        elif self._mode == "chunked":
            self._parse_chunks(buffer)
        else:
            self._absorb(buffer, len(buffer))

    def _start_body(self, status: int, http10: bool, headers: dict[str, str]) -> None:
        self._status = status
        self._headers = headers
        tokens = {token.strip() for token in headers.get("connection", "").lower().split(",")}
        self._reusable = "close" not in tokens and (not http10 or "keep-alive" in tokens)
        if 200 <= status < 300:
            self._keep = 0  # a success needs no body
        encoding = headers.get("transfer-encoding")
        length = headers.get("content-length")
        if status in (204, 304):
            self._mode, self._remaining = "length", 0
        elif encoding is not None:
            if length is not None:
                self._reusable = False  # RFC 9112 6.3: a sign of smuggling or a bad proxy
            if encoding.lower().rsplit(",", 1)[-1].strip() == "chunked":
                self._mode, self._remaining = "chunked", -1
            else:
                self._mode = "close"
        elif length is not None:
            if not length.isdigit() or not length.isascii():
                raise BadResponse(f"an invalid Content-Length: {length[:30]!r}")
            self._mode, self._remaining = "length", int(length)
        else:
            self._mode = "close"
        if self._mode == "close":
            self._reusable = False

    def _parse_chunks(self, buffer: bytearray) -> None:
        while self._waiter is not None:
            if self._remaining > 0:
                taken = min(len(buffer), self._remaining)
                self._remaining -= taken
                if not self._absorb(buffer, taken) or self._remaining:
                    return
                self._remaining = -2
                continue
            if self._remaining == -2:
                if buffer[:2] == b"\r\n":
                    del buffer[:2]
                elif buffer[:1] == b"\n":
                    del buffer[:1]
                elif buffer == b"\r" or not buffer:
                    return
                else:
                    raise BadResponse("a chunk longer than its size")
                self._remaining = -1
                continue
            newline = buffer.find(b"\n")
            if newline < 0:
                if len(buffer) > HEAD_LIMIT:
                    raise BadResponse(f"a chunk line over {HEAD_LIMIT} bytes")
                return
            line = bytes(buffer[:newline]).rstrip(b"\r")
            del buffer[: newline + 1]
            if self._remaining == -3:  # trailers, up to an empty line
                if not line:
                    self._finish(self._reusable)
                continue
            size = _CHUNK_SIZE.fullmatch(line)
            if size is None:
                raise BadResponse(f"an invalid chunk size line: {line[:30]!r}")
            self._remaining = int(size[1], 16) or -3

    def _absorb(self, buffer: bytearray, count: int) -> bool:
        """Take ``count`` body bytes off ``buffer``, keeping what the caller asked for;
        False once past :data:`DRAIN_LIMIT`, the answer then given with the body read."""
        room = self._keep - len(self._body)
        if room > 0:
            self._body += buffer[: min(count, room)]
        del buffer[:count]
        self._drained += count
        if self._drained > DRAIN_LIMIT:
            self._finish(reusable=False)
            return False
        return True

    def _finish(self, reusable: bool) -> None:
        waiter = self._waiter
        assert waiter is not None
        self._waiter = None
        response = Response(self._status, self._headers, bytes(self._body))
        # Bytes past the answer were never asked for: the connection is not reused.
        if not reusable or self._buffer or self.closed:
            self.abort()
        self._buffer.clear()
        self._reset()
        if not waiter.done():
            waiter.set_result(response)


class Client:
    """Pooled HTTP/1.1 connections for one event loop; see the module for the rules."""

    def __init__(self, kept: int = 64, ssl_context: ssl.SSLContext | None = None) -> None:
        self._kept = max(1, kept)
        self._ssl = ssl_context
        #: Idle connections by (scheme, host, port), least recently used key first.
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._idle_count = 0
        self._open: set[_Connection] = set()
        self._endpoints: dict[str, _Endpoint] = {}

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout: float, keep: int
    ) -> Response:
        """POST ``body`` with ``headers`` (and Host, Content-Length) to ``url``.

        The answer keeps the first ``keep`` bytes of a body that is not a success's.
        Raises ``asyncio.TimeoutError`` after ``timeout`` seconds in all, :class:`HttpError`
        when no usable answer came, ``ValueError`` for a URL or header that cannot be sent.
        """
        endpoint = self._endpoints.get(url)
        if endpoint is None:
            if len(self._endpoints) >= _ENDPOINT_CACHE:
                self._endpoints.clear()
            endpoint = self._endpoints[url] = parse_endpoint(url)
        fields = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
        # One CR and one LF a header, both at its end (build_headers lets no other through).
        lines = len(headers)
        if fields.count("\n") != lines or fields.count("\r") != lines or "\x00" in fields:
            raise ValueError("a header name or value holds a line break or a NUL")
        data = f"{endpoint.head}{fields}Content-Length: {len(body)}\r\n\r\n".encode("ascii") + body
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        conn = self._take(endpoint.key)
        if conn is not None:
            try:
                return await self._exchange(conn, data, keep, deadline)
            except NoResponse:
                pass  # the server closed it as the request went out: once more, anew
        conn = await self._connect(endpoint, deadline)
        return await self._exchange(conn, data, keep, deadline)

    async def close(self) -> None:
        """Close every connection, idle or busy (their requests fail)."""
        for conn in list(self._open):
            conn.abort()
        self._idle.clear()
        self._idle_count = 0
        await asyncio.sleep(0)  # the transports close on the next turn of the loop

    async def _exchange(
        self, conn: _Connection, data: bytes, keep: int, deadline: float
    ) -> Response:
        loop = asyncio.get_running_loop()
        timer = loop.call_at(deadline, conn.expire)
        try:
            response = await conn.request(data, keep)
        except BaseException:
            conn.abort()  # given up (cancelled, say) with the answer unread: unusable
            raise
        finally:
            timer.cancel()
        if conn.closed:
            pass
        elif conn.transport is not None and conn.transport.get_write_buffer_size():
            # Answered before the body was all sent: the server cannot frame a next request.
            conn.abort()
        else:
            self._put(conn)
        return response

    async def _connect(self, endpoint: _Endpoint, deadline: float) -> _Connection:
        loop = asyncio.get_running_loop()
        context = None
        if endpoint.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(endpoint.key, self._open),
                    endpoint.host,
                    endpoint.port,
                    ssl=context,
                    server_hostname=endpoint.host if context else None,
                ),
                deadline - loop.time(),
            )
        except asyncio.TimeoutError:  # an OSError too since Python 3.11: the worker's timeout
            raise
        except OSError as exc:  # refusals, name lookups, TLS (ssl.SSLError is an OSError)
            if exc.errno and exc.errno > 0 and not isinstance(exc, ssl.SSLError):
                reason = os.strerror(exc.errno)
            else:
                reason = str(exc) or type(exc).__name__
            raise ConnectError(f"{reason} ({endpoint.host}:{endpoint.port})") from exc
        return conn

    def _take(self, key: tuple[str, str, int]) -> _Connection | None:
        stack = self._idle.get(key)
        while stack:
            conn = stack.pop()
            self._idle_count -= 1
            if not stack:
                del self._idle[key]
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    def _put(self, conn: _Connection) -> None:
        stack = self._idle.pop(conn.key, None) or []
        stack.append(conn)
        self._idle[conn.key] = stack  # last: the most recently used key
        self._idle_count += 1
        while self._idle_count > self._kept:
            oldest_key = next(iter(self._idle))
            oldest = self._idle[oldest_key]
            oldest.pop(0).abort()
            self._idle_count -= 1
            if not oldest:
                del self._idle[oldest_key]
