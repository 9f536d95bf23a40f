"""HTTP/1.1 POSTs over pooled keep-alive connections, on asyncio's protocols.

The external dispatcher's HTTP client, which also sends the admin's test request (so the
policy, the deadline and the redirect rule have one implementation). It needs one narrow
thing: a POST whose headers are already checked (:func:`pgmb.worker_request.build_headers`),
the answer's status, its headers and the first bytes of its body. A general client
(aiohttp) costs two to three times the CPU a request for what it offers beyond that, and
that cost would bound the dispatcher's throughput
(docs/decisions/0011-the-dispatchers-own-http-client.md).

Answers are parsed by llhttp (through ``httptools``, as uvicorn does), which reads them as
RFC 9112 says: interim 1xx answers are skipped, no framing at all means the body ends with
the connection, and what breaks HTTP/1.1 (a Content-Length that is not a number or does not
fit, both Content-Length and Transfer-Encoding, a CR alone in a line, a chunk longer than its
size, a version other than HTTP/1.0 and 1.1) is :class:`BadResponse`, which costs only the
connection. A lone LF ends a line, as RFC 9112 2.2 allows in a head (llhttp's leniency takes
it in chunked framing too). A head (status line and headers, or a chunked body's trailers)
may take :data:`HEAD_LIMIT` bytes.

Its keep-alive rules are the PL/Python transport's (``pgmb.sql.plpython_transport``, which
runs in the database), and one table of tests runs both (``tests/dispatch/test_keepalive.py``):

* a connection is kept when the answer said nothing against it (``Connection: close``,
  HTTP/1.0 without ``keep-alive``, a body that ends with the connection, Transfer-Encoding
  in HTTP/1.0, bytes past the answer) and its body was read to the end within
  :data:`DRAIN_LIMIT`; past that, closing costs less than reading on;
* an idle connection the server closed is dropped when found. A request whose kept
  connection ends before any byte of an answer is sent once more on a new connection:
  the server most likely closed it as the request went out (at-least-once: should it have
  handled the request, a duplicate);
* at most ``kept`` idle connections are held, the least recently used closed first.

Connections to a name with several addresses are made as RFC 8305 says (Happy Eyeballs):
IPv6 and IPv4 addresses interleaved, the next tried :data:`HAPPY_EYEBALLS_DELAY` after the
last, so that a dead address costs a fraction of a second rather than the worker's timeout.

The client resolves a name itself and connects only to the addresses its endpoint policy
allows (``PGMB["ENDPOINT_POLICY"]``, :mod:`pgmb.endpoint_policy`): the check is on the
address connected to, so an answer that changes after any earlier check cannot reach a
refused address. TLS still names and verifies the endpoint's host name. A request's timeout
is a total deadline: connecting, sending and reading the answer all end by then.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import ipaddress
import os
import re
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NoReturn
from urllib.parse import quote, unquote, urlsplit

import httptools

from .. import endpoint_policy
from ..endpoint_masking import mask_credentials

#: Body bytes read past what the caller keeps, to reuse the connection; beyond, it closes.
DRAIN_LIMIT = 1 << 20
#: An answer's status line and headers may take this many bytes, as aiohttp allowed.
HEAD_LIMIT = 64 * 1024
#: Seconds before the next address of a name is tried while the last still connects.
HAPPY_EYEBALLS_DELAY = 0.25
#: Parsed URLs kept; the cache is emptied past this many (endpoints rarely change).
_ENDPOINT_CACHE = 1000

#: What may not appear in a request's head other than at a line's end.
_UNSAFE = re.compile(r"[\x00\r\n]")
#: RFC 3986 characters a path and a query keep as they are; others are percent-encoded.
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_QUERY_SAFE = _PATH_SAFE + "?"


class HttpError(Exception):
    """The request got no usable HTTP answer."""


class ConnectError(HttpError):
    """No connection could be made (name lookup, refusal, TLS handshake or certificate)."""


class Refused(ConnectError):
    """The endpoint policy refused every address of the endpoint: nothing was sent."""


class NoResponse(HttpError):
    """The connection ended before any byte of an answer."""


class BadResponse(HttpError):
    """The answer broke HTTP/1.1; the connection was closed."""


@dataclass(frozen=True)
class Response:
    """An answer: its status, its headers (lower-case names; repeated ones joined with
    ``", "``), the first bytes of its body, as many as the caller asked to keep, and its
    reason phrase."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    #: What the status line said after the code; not part of what an answer is.
    reason: str = field(default="", compare=False)


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
        raise ValueError(f"a line break or a NUL in the URL {mask_credentials(url)!r}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"unknown url type: {mask_credentials(url)!r}")
    host = parts.hostname
    if not host:
        raise ValueError(f"no host given: {mask_credentials(url)!r}")
    tls = scheme == "https"
    default = 443 if tls else 80
    port = parts.port or default  # .port raises ValueError for a port out of range
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise ValueError(f"invalid host name in {mask_credentials(url)!r}: {exc}") from None
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


class _Stop(Exception):
    """Raised in a parser callback to stop parsing: the rest of the bytes go unread."""


class Connection(asyncio.Protocol):
    """One connection: sends a request, parses its answer, fails its waiter if it ends.

    It is also the parser's protocol: httptools calls its ``on_*`` methods as it reads.
    The client makes these; tests feed one answers a read at a time.
    """

    def __init__(self, key: tuple[str, str, int], registry: set[Connection]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._registry = registry
        self._parser = httptools.HttpResponseParser(self)
        # RFC 9112 2.2: a recipient may take a lone LF for a line's end (h11 does too).
        self._parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=True)
        #: The end of a head line still to come, held back (see ``_take``).
        self._partial = bytearray()
        self._waiter: asyncio.Future[Response] | None = None
        self._keep = 0
        self._keep_success = False
        self._reset()

    def _reset(self) -> None:
        self._received = False
        #: Until the final answer's headers end, and again in a chunked body's trailers.
        self._in_head = True
        self._head_bytes = 0
        self._status = 0
        self._reason = ""
        self._http10 = False
        self._transfer_encoding = False
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self._drained = 0
        #: A chunk's size line was read and none of its data yet: trailers may follow.
        self._chunk_open = False
        self._complete = False
        self._reusable = False
        #: Why parsing was stopped from a callback: past DRAIN_LIMIT, or bytes past the answer.
        self._stopped = ""
        self._error: BadResponse | None = None

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
            # The final head came: a body that ends with the connection ends here (llhttp
            # waits for an end of input that httptools cannot give it), one cut short
            # only costs the connection.
            self._finish()
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
        try:
            self._take(data)
        except BadResponse as exc:
            waiter.set_exception(exc)
            self.abort()
            return
        if self._complete or self._stopped:
            self._finish()

    # --- used by the client ---

    def request(
        self, data: bytes, keep: int, keep_success: bool = False
    ) -> asyncio.Future[Response]:
        """Send one request; the future gets its answer or the reason there is none."""
        assert self.transport is not None and self._waiter is None
        self._waiter = asyncio.get_running_loop().create_future()
        self._keep = keep
        self._keep_success = keep_success
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

    # --- feeding the parser ---

    def _take(self, data: bytes) -> None:
        """Feed ``data`` to the parser; within a head, only up to its last line end.

        httptools joins the pieces of a header line split across reads by copying them,
        so a head sent a byte at a time would cost quadratic time: head lines are held
        back until whole, and each byte is searched and fed once.
        """
        if not self._in_head:
            self._feed_body(data)
        else:
            cut = data.rfind(b"\n") + 1
            if not cut:
                self._partial += data
            elif self._partial:
                self._partial += data[:cut]
                self._feed(self._partial)
                self._partial.clear()
            else:
                self._feed(data if cut == len(data) else memoryview(data)[:cut])
            if cut and cut < len(data):
                if self._complete or self._stopped:
                    self._stopped = self._stopped or "bytes past the answer"
                elif self._in_head:
                    self._partial += data[cut:]
                else:
                    self._feed_body(memoryview(data)[cut:])
        if self._in_head and self._head_bytes + len(self._partial) > HEAD_LIMIT:
            raise BadResponse(f"a response head over {HEAD_LIMIT} bytes")

    def _feed_body(self, data: bytes | memoryview) -> None:
        opened = self._chunk_open
        drained = self._drained
        self._feed(data)
        if opened and self._chunk_open and not self._complete:
            # Bytes after a chunk's size line that were not its data: the last chunk's
            # trailers, a head of their own from here on.
            self._in_head = True
            self._head_bytes += len(data) - (self._drained - drained)

    def _feed(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self._error is not None:
                raise self._error from None
            if self._complete or self._stopped:
                self._stopped = self._stopped or "bytes past the answer"
                return
            raise BadResponse(str(exc)) from None

    def _refuse(self, reason: str) -> NoReturn:
        self._error = BadResponse(reason)
        raise self._error

    # --- httptools callbacks ---

    def on_message_begin(self) -> None:
        if self._complete:
            self._stopped = "bytes past the answer"
            raise _Stop
        self._head_bytes = 0
        self._headers = {}
        self._transfer_encoding = False

    def on_status(self, reason: bytes) -> None:
        self._reason = reason.decode("latin-1")  # an interim answer's is replaced
        self._head_bytes += len(reason) + 15  # the rest of the status line, about
        if self._head_bytes > HEAD_LIMIT:
            self._refuse(f"a response head over {HEAD_LIMIT} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > HEAD_LIMIT:
            self._refuse(f"a response head over {HEAD_LIMIT} bytes")
        if self._status:
            return  # a trailer
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1").strip(" \t")
        if key == "transfer-encoding":
            self._transfer_encoding = True
        before = self._headers.get(key)
        self._headers[key] = text if before is None else f"{before}, {text}"

    def on_headers_complete(self) -> None:
        version = self._parser.get_http_version()
        if version not in ("1.1", "1.0"):  # llhttp also reads 0.9 and 2.0 status lines
            self._refuse(f"HTTP/{version} is not HTTP/1.x")
        status = self._parser.get_status_code()
        if status < 100:
            self._refuse(f"status {status}")
        if status == 101:
            self._refuse("101 Switching Protocols, never asked for")
        if status < 200:
            return  # interim; the final answer follows
        self._status = status
        self._http10 = version == "1.0"
        self._in_head = False
        if status < 300 and not self._keep_success:
            self._keep = 0  # a success needs no body

    def on_body(self, data: bytes) -> None:
        self._chunk_open = False
        room = self._keep - len(self._body)
        if room > 0:
            self._body += data[:room]
        self._drained += len(data)
        if self._drained > DRAIN_LIMIT:
            # Past this, closing the connection costs less than reading on.
            self._stopped = "past the drain limit"
            raise _Stop

    def on_chunk_header(self) -> None:
        self._chunk_open = True

    def on_chunk_complete(self) -> None:
        self._chunk_open = False

    def on_message_complete(self) -> None:
        if not self._status:
            return  # an interim answer
        self._complete = True
        self._in_head = False
        # RFC 9112 6.1: Transfer-Encoding in HTTP/1.0 is framing that cannot be trusted;
        # the answer is read, the connection closed.
        self._reusable = self._parser.should_keep_alive() and not (
            self._http10 and self._transfer_encoding
        )

    def _finish(self) -> None:
        waiter = self._waiter
        assert waiter is not None
        self._waiter = None
        response = Response(self._status, self._headers, bytes(self._body), self._reason)
        reusable = self._complete and self._reusable and not self._stopped and not self._partial
        if not reusable or self.closed:
            self.abort()
        self._partial.clear()
        self._reset()
        if not waiter.done():
            waiter.set_result(response)


class Client:
    """Pooled HTTP/1.1 connections for one event loop; see the module for the rules."""

    def __init__(
        self,
        kept: int = 64,
        ssl_context: ssl.SSLContext | None = None,
        policy: endpoint_policy.Policy | None = None,
    ) -> None:
        self._kept = max(1, kept)
        self._ssl = ssl_context
        #: None: every address may be reached (tests of the client alone).
        self._policy = policy
        #: Idle connections by (scheme, host, port), least recently used key first.
        self._idle: dict[tuple[str, str, int], list[Connection]] = {}
        self._idle_count = 0
        self._open: set[Connection] = set()
        self._endpoints: dict[str, _Endpoint] = {}

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        timeout: float,
        keep: int,
        *,
        keep_success: bool = False,
    ) -> Response:
        """POST ``body`` with ``headers`` (and Host, Content-Length) to ``url``.

        The answer keeps the first ``keep`` bytes of a body that is not a success's (of a
        success's too with ``keep_success``: the admin's test request shows it).
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
                return await self._exchange(conn, data, keep, keep_success, deadline)
            except NoResponse:
                pass  # the server closed it as the request went out: once more, anew
        conn = await self._connect(endpoint, deadline)
        return await self._exchange(conn, data, keep, keep_success, deadline)

    async def close(self) -> None:
        """Close every connection, idle or busy (their requests fail)."""
        for conn in list(self._open):
            conn.abort()
        self._idle.clear()
        self._idle_count = 0
        await asyncio.sleep(0)  # the transports close on the next turn of the loop

    async def _exchange(
        self, conn: Connection, data: bytes, keep: int, keep_success: bool, deadline: float
    ) -> Response:
        loop = asyncio.get_running_loop()
        timer = loop.call_at(deadline, conn.expire)
        try:
            response = await conn.request(data, keep, keep_success)
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

    async def _connect(self, endpoint: _Endpoint, deadline: float) -> Connection:
        loop = asyncio.get_running_loop()
        context = None
        if endpoint.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            _, conn = await asyncio.wait_for(
                self._open_connection(endpoint, context), deadline - loop.time()
            )
        except asyncio.TimeoutError:  # an OSError too since Python 3.11: the worker's timeout
            raise
        except endpoint_policy.EndpointRefused as exc:
            raise Refused(str(exc)) from exc
        except OSError as exc:  # refusals, name lookups, TLS (ssl.SSLError is an OSError)
            if exc.errno and exc.errno > 0 and not isinstance(exc, ssl.SSLError):
                reason = os.strerror(exc.errno)
            else:
                reason = str(exc) or type(exc).__name__
            raise ConnectError(f"{reason} ({endpoint.host}:{endpoint.port})") from exc
        return conn

    async def _open_connection(
        self, endpoint: _Endpoint, context: ssl.SSLContext | None
    ) -> tuple[asyncio.BaseTransport, Connection]:
        """A connection to an address of the endpoint the policy allows. An address literal
        is checked as it is; a name is resolved here, its refused addresses dropped, and
        asyncio connects to the addresses kept (numeric: it resolves nothing again)."""
        loop = asyncio.get_running_loop()
        factory = functools.partial(Connection, endpoint.key, self._open)
        server_hostname = endpoint.host if context else None
        policy = self._policy
        if policy is None:
            hosts: list[str] = [endpoint.host]
        elif _is_address(endpoint.host):
            endpoint_policy.allowed(policy, endpoint.host, [_literal_info(endpoint.host)])
            hosts = [endpoint.host]
        else:
            infos = await loop.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
            kept = endpoint_policy.allowed(policy, endpoint.host, infos)
            if not kept:
                raise OSError(f"no address for {endpoint.host}")
            if len(kept) == 1:
                hosts = [kept[0][4][0]]
            else:
                # Several addresses: raced as RFC 8305 says, on sockets made here.
                sock = await _happy_eyeballs(loop, kept)
                return await loop.create_connection(
                    factory, sock=sock, ssl=context, server_hostname=server_hostname
                )
        return await loop.create_connection(
            factory,
            hosts[0],
            endpoint.port,
            ssl=context,
            server_hostname=server_hostname,
            happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY,
            interleave=1,
        )

    def _take(self, key: tuple[str, str, int]) -> Connection | None:
        stack = self._idle.get(key)
        while stack:
            conn = stack.pop()
            self._idle_count -= 1
            if not stack:
                del self._idle[key]
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    def _put(self, conn: Connection) -> None:
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


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def _literal_info(host: str) -> endpoint_policy.AddrInfo:
    return (0, socket.SOCK_STREAM, 0, "", (host, 0))


def _interleaved(infos: list[endpoint_policy.AddrInfo]) -> list[endpoint_policy.AddrInfo]:
    """IPv6 and IPv4 addresses alternated, the first answer's family first (RFC 8305)."""
    first = [i for i in infos if i[0] == infos[0][0]]
    other = [i for i in infos if i[0] != infos[0][0]]
    mixed: list[endpoint_policy.AddrInfo] = []
    for k in range(max(len(first), len(other))):
        mixed.extend(group[k] for group in (first, other) if k < len(group))
    return mixed


async def _happy_eyeballs(
    loop: asyncio.AbstractEventLoop, infos: list[endpoint_policy.AddrInfo]
) -> socket.socket:
    """A socket connected to the first of ``infos`` to answer, each next address tried
    HAPPY_EYEBALLS_DELAY after the last (asyncio's own race, on the checked addresses)."""
    from asyncio import staggered

    async def attempt(info: endpoint_policy.AddrInfo) -> socket.socket:
        family, kind, proto, _, address = info
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
        except BaseException:
            sock.close()
            raise
        return sock

    attempts = [functools.partial(attempt, info) for info in _interleaved(infos)]
    sock, _, errors = await staggered.staggered_race(attempts, HAPPY_EYEBALLS_DELAY)
    if sock is None:
        raise errors[-1] if errors and errors[-1] is not None else OSError("connect failed")
    return sock
