-- What migration 0003_release_0_2_0 runs: a frozen copy of the files of pgmb/sql/schema/
-- that pgmb.sql.PLPYTHON names, in its order.
-- Written by `make schema` until its release is cut, never edited after: read and
-- change pgmb/sql/schema/, and put a released schema's changes in the next
-- release's migration (docs/decisions/0023-one-migration-per-release.md).

-- ==== pgmb/sql/schema/plpython.sql ====
-- The PL/Python transport of the in-database loop. Loaded only where plpython3u exists or
-- can be created: without it, migrating succeeds, `manage.py check` says what the
-- in-database path lacks, and `manage.py pgmb_cron install` loads this file once the
-- language is there.
--
-- The transport keeps up to 8 requests of a run in flight (docs/decisions/0010-in-database-dispatch-in-batches.md, "Windows of
-- requests in the in-database loop"): it sends a window of requests, each on a connection of
-- its own, then reads their answers in order, so the endpoint answers one request while the
-- backend sends or reads another, instead of the backend waking up for every answer.

-- The transport's Python is pgmb/sql/plpython_transport.py, a module that ruff and mypy
-- check like the rest of pgmb: pgmb.sql.schema_source splices its text into
-- pgmb.load_plpython_transport's body in place of the splice mark there
-- (docs/decisions/0069-the-plpython-transport-in-a-checked-module.md), so what runs is what
-- was checked. The module says how a request keeps its deadline, which addresses it
-- connects to and which of its failures are pgmb's own.
--
-- pgmb.load_plpython_transport defines the transport's code once per session and keeps a
-- Transport (its kept connections, several per endpoint, resolver threads, plans) in
-- PL/Python's GD under a key that carries its version: a session that crosses an upgrade
-- never runs an older version's code. pgmb.post_via_plpython posts one request with it,
-- pgmb.post_run_via_plpython a run in windows.
CREATE OR REPLACE FUNCTION pgmb.load_plpython_transport()
RETURNS void
LANGUAGE plpython3u AS $py$
"""The PL/Python transport of the in-database loop: the Python that
``pgmb.load_plpython_transport`` runs in the database (docs/decisions/0069).

``pgmb.sql.schema_source`` splices this file's text, as it is, into that function's body
(``pgmb/sql/schema/plpython.sql``), whose last line keeps a :class:`Transport` for the
session in PL/Python's ``GD``; ``pgmb.post_via_plpython`` and ``pgmb.post_run_via_plpython``
call it. So this text runs inside a function body, not as a module: no ``from __future__``
import, annotations name only what is defined above them, nothing here may use ``plpy`` or
``GD`` but through a :class:`Transport`, which takes them, and the text must never hold the
body's dollar quote. Importing it elsewhere (ruff, mypy, tests) runs nothing.

A request's timeout is a total deadline (docs/delivery.md): connecting, the TLS handshake,
sending and reading its answer all end by then. Socket timeouts bound one operation each, so
the transport's sockets set what is left of the deadline before each one: a server that sends
an answer a byte at a time cannot hold the backend past it. A connection is made only to an
address the database's endpoint policy allows (pgmb.endpoint_refused, checked after name
resolution, on the address connected to), so an answer that changes after a check cannot
reach a refused address. Name resolution ends by the deadline too: a name is resolved in a
thread of the transport's (a few at most, kept for the session), which the request stops
waiting for at its deadline, so a resolver that does not answer costs the request its
timeout, not the resolver's own retries.

A URL's user and password are sent as Basic credentials, as pgmb_dispatch sends them. What
the transport cannot build or encode, and an address the policy refuses, is a failure of
pgmb's own (its error begins "pgmb's own failure: ", pgmb.own_failure): never the endpoint's
(breakers.sql). Connections are kept in lists, several per endpoint.
"""

import base64
import concurrent.futures
import http.client
import ipaddress
import json
import select
import signal
import socket
import ssl
import time
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any, Protocol, cast
from urllib.parse import unquote, urlsplit

# A response body is read to its end so that its connection can carry the next request; past
# this many bytes closing the connection costs less than reading on.
BODY_LIMIT = 1 << 20
# Connections kept per backend, the least recently used closed first: a session that posts
# to many endpoints must not hold a socket open for each of them.
KEPT = 64
# A kept connection's failure before any answer: the server most likely closed it just as
# the request went out. RemoteDisconnected is a ConnectionResetError.
STALE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)
# Names resolved at once, at most: a lookup that outlives its request's deadline holds its
# thread until the resolver gives up; later lookups wait for a free one, by their deadline.
RESOLVERS = 4
# How the error of a failure of pgmb's own begins (pgmb.dispatch.client.OWN_FAILURE).
OWN_FAILURE = "pgmb's own failure: "
# The answer that dead-letters at once (pgmb.final_answers, pgmb.abort_header() in SQL): a
# non-2xx answer with this header and value begins its error with ABORTED.
ABORT_HEADER = "Pgmb-Delivery"
ABORT_VALUE = "abort"
ABORTED = "the worker answered Pgmb-Delivery: abort, so it is dead-lettered at once: "
# Requests of a run in flight at once. Measured on a 2-core machine against nginx: 8 posted
# 2.3-3x as many requests a second as 1, and 16 no more than 8 (docs/benchmarks.md).
WINDOW = 8

# Where a session keeps what outlives one call, in GD. The keys carry a version (bump the
# suffix in the release whose migration changes what is kept under it): a session that
# crosses an upgrade never runs the code of the version before.
CONNECTIONS_KEY = "pgmb_connections_v1"
RESOLVERS_KEY = "pgmb_resolvers_v2"
TLS_CONTEXT_KEY = "pgmb_tls_context_v1"
REFUSED_PLAN_KEY = "pgmb_refused_plan"
OUTCOME_PLAN_KEY = "pgmb_outcome_plan"
INTERRUPT_PENDING_KEY = "pgmb_interrupt_pending"
INTERRUPTS_PLAN_KEY = "pgmb_interrupts_plan"

#: An outcome: (status, error, retry_after, duration_ms), the columns of pgmb.http_outcome.
Outcome = tuple[int | None, str | None, float | None, float]
#: An outcome of a run, and when it came (seconds since the epoch).
RunOutcome = tuple[int | None, str | None, float | None, float, float]


class SpiExceptions(Protocol):
    """The part of ``plpy.spiexceptions`` the transport uses."""

    QueryCanceled: type[Exception]


class Plpy(Protocol):
    """The part of PL/Python's ``plpy`` module the transport uses."""

    spiexceptions: SpiExceptions

    def prepare(self, query: str, types: Sequence[str] = ...) -> object: ...

    def execute(self, query: object, args: Sequence[object] = ...) -> Sequence[Any]: ...


class Refused(OSError):
    """The endpoint's name resolves to no address the endpoint policy allows."""


class Unbuildable(Exception):
    """The request could not be built or encoded: nothing was sent."""


def left(deadline: float) -> float:
    """Seconds left until deadline (time.monotonic()); TimeoutError when none."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("timed out")
    return remaining


def bound(sock: socket.socket, deadline: float | None) -> None:
    """Set sock's timeout to what is left of deadline, or next to nothing past it."""
    if deadline is not None:
        sock.settimeout(max(deadline - time.monotonic(), 1e-6))


class DeadlineSocket(socket.socket):
    """A socket whose every send and receive ends by its request's deadline. Past it, what
    has already arrived is still read (a window's later answers wait in their sockets while
    an earlier one is read), but nothing is waited for."""

    deadline: float | None = None

    def recv_into(self, *args: Any, **kwargs: Any) -> int:
        bound(self, self.deadline)
        return super().recv_into(*args, **kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> bytes:
        bound(self, self.deadline)
        return super().recv(*args, **kwargs)

    def sendall(self, *args: Any, **kwargs: Any) -> None:
        bound(self, self.deadline)
        return super().sendall(*args, **kwargs)

    def send(self, *args: Any, **kwargs: Any) -> int:
        bound(self, self.deadline)
        return super().send(*args, **kwargs)


class DeadlineSSLSocket(ssl.SSLSocket):
    """The same over TLS (ssl.SSLContext.sslsocket_class)."""

    deadline: float | None = None

    def recv_into(self, *args: Any, **kwargs: Any) -> int:
        bound(self, self.deadline)
        return super().recv_into(*args, **kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> bytes:
        bound(self, self.deadline)
        return super().recv(*args, **kwargs)

    def read(self, *args: Any, **kwargs: Any) -> bytes:
        bound(self, self.deadline)
        return super().read(*args, **kwargs)

    def sendall(self, *args: Any, **kwargs: Any) -> None:
        bound(self, self.deadline)
        return super().sendall(*args, **kwargs)

    def send(self, *args: Any, **kwargs: Any) -> int:
        bound(self, self.deadline)
        return super().send(*args, **kwargs)

    def write(self, *args: Any, **kwargs: Any) -> int:
        bound(self, self.deadline)
        return super().write(*args, **kwargs)


class Deadlined(Protocol):
    """A socket of the transport's: DeadlineSocket or DeadlineSSLSocket (or either class as
    the version before this one's code defined it, for a connection kept across an
    upgrade)."""

    deadline: float | None


class Request:
    """A POST that send() wrote, waiting for receive() to read its answer."""

    def __init__(
        self,
        key: tuple[str, str, int],
        target: str,
        headers: dict[bytes, bytes],
        data: bytes,
        timeout: float,
        started: float,
        conn: http.client.HTTPConnection | None,
    ) -> None:
        self.key = key
        self.target = target
        self.headers = headers
        self.data = data
        self.timeout = timeout
        self.started = started
        self.conn = conn
        self.deadline = time.monotonic() + timeout
        self.reused = conn is not None


def failure(exc: BaseException, timeout: float, started: float) -> Outcome:
    """The outcome of a request that got no HTTP answer."""
    duration = (time.perf_counter() - started) * 1000
    if isinstance(exc, Refused):
        return (None, OWN_FAILURE + f"connection failed: {exc}", None, duration)
    if isinstance(exc, Unbuildable):
        return (None, OWN_FAILURE + f"could not build the request: {exc}", None, duration)
    if isinstance(exc, TimeoutError) or "timed out" in str(exc):
        return (None, f"timeout after {timeout:g}s", None, duration)
    return (None, f"{type(exc).__name__}: {exc}", None, duration)


class Transport:
    """The session's transport: its kept connections, resolver threads, TLS context and
    plans live in ``gd`` (PL/Python's GD, which lives as long as the backend; one backend
    runs one loop: no locking), its queries go through ``plpy``."""

    def __init__(self, plpy: Plpy, gd: MutableMapping[str, Any]) -> None:
        self.plpy = plpy
        self.gd = gd
        self.pool: dict[tuple[str, str, int], list[http.client.HTTPConnection]] = gd.setdefault(
            CONNECTIONS_KEY, {}
        )

    def resolvers(self) -> concurrent.futures.ThreadPoolExecutor:
        """The session's resolver threads. They are started with every signal blocked, so
        that the signals PostgreSQL sends the backend reach its own thread only."""
        executor = self.gd.get(RESOLVERS_KEY)
        if executor is None:
            executor = self.gd[RESOLVERS_KEY] = concurrent.futures.ThreadPoolExecutor(
                RESOLVERS, thread_name_prefix="pgmb-resolve"
            )
        return cast(concurrent.futures.ThreadPoolExecutor, executor)

    def resolve(self, host: str, port: int, deadline: float) -> list[Any]:
        """socket.getaddrinfo of host, by deadline. An address literal is read at once."""
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            pass
        else:
            return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        executor = self.resolvers()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            lookup = executor.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        try:
            return lookup.result(timeout=left(deadline))
        except concurrent.futures.TimeoutError:
            lookup.cancel()
            raise TimeoutError("timed out") from None

    def tls_context(self) -> ssl.SSLContext:
        context = self.gd.get(TLS_CONTEXT_KEY)
        if context is None:
            context = self.gd[TLS_CONTEXT_KEY] = ssl.create_default_context()
            context.sslsocket_class = DeadlineSSLSocket
        return cast(ssl.SSLContext, context)

    def refused(self, address: str) -> bool:
        plan = self.gd.get(REFUSED_PLAN_KEY)
        if plan is None:
            plan = self.gd[REFUSED_PLAN_KEY] = self.plpy.prepare(
                "SELECT pgmb.endpoint_refused($1::inet) AS refused", ["text"]
            )
        return bool(self.plpy.execute(plan, [address.split("%", 1)[0]])[0]["refused"])

    def connector(self, deadline: float) -> Callable[..., socket.socket]:
        """http.client's _create_connection: resolves, keeps the addresses the policy allows
        and connects to those only, by deadline."""

        def create_connection(
            address: tuple[str, int],
            timeout: object = None,
            source_address: object = None,
            *args: object,
        ) -> socket.socket:
            host, port = address
            infos = self.resolve(host, port, deadline)
            kept = [info for info in infos if not self.refused(info[4][0])]
            if infos and not kept:
                addresses = ", ".join(sorted({info[4][0] for info in infos}))
                raise Refused(
                    f"{host} resolves to {addresses}, which the endpoint policy "
                    "(pgmb.endpoint_policy) refuses"
                )
            error = OSError(f"no address for {host}")
            for family, kind, proto, _, sockaddr in kept:
                sock = DeadlineSocket(family, kind, proto)
                try:
                    sock.settimeout(left(deadline))
                    sock.connect(sockaddr)
                    # What is left after connecting: HTTPSConnection wraps this socket with
                    # its timeout, which the ssl module takes as the handshake's total
                    # duration, so the handshake ends by the request's deadline too, not a
                    # timeout later.
                    sock.settimeout(left(deadline))
                    sock.deadline = deadline
                    return sock
                except OSError as exc:
                    sock.close()
                    error = exc
            raise error

        return create_connection

    def take(self, key: tuple[str, str, int]) -> http.client.HTTPConnection | None:
        """A kept connection to key, or None. An idle connection has nothing to say:
        readable means the server closed it (or broke the protocol). Found now, it costs no
        request sent in vain. poll, not select: a backend's descriptors may number past
        select's 1024."""
        kept = self.pool.get(key)
        while kept:
            conn = kept.pop()
            if not kept:
                del self.pool[key]
            idle = select.poll()
            idle.register(conn.sock, select.POLLIN)
            if not idle.poll(0):
                return conn
            conn.close()
        return None

    def keep(self, key: tuple[str, str, int], conn: http.client.HTTPConnection) -> None:
        pool = self.pool
        kept = pool.pop(key, None) or []
        kept.append(conn)
        pool[key] = kept  # last: the most recently used endpoint
        while sum(len(conns) for conns in pool.values()) > KEPT:
            oldest = next(iter(pool))
            pool[oldest].pop(0).close()
            if not pool[oldest]:
                del pool[oldest]

    def masked(self, url: str) -> str:
        """The URL as errors show it: credentials masked, as pgmb.mask_credentials does
        (errors are stored, and shown in the admin)."""
        plan = self.plpy.prepare("SELECT pgmb.mask_credentials($1) AS url", ["text"])
        return str(self.plpy.execute(plan, [url])[0]["url"])

    def send(self, url: str, body: str, headers: str, timeout: float) -> Request | Outcome:
        """Sends one POST (headers: a JSON object). Returns what receive() needs to read its
        answer, or, when no request could be sent, its outcome."""
        started = time.perf_counter()
        try:
            parts = urlsplit(url)
            scheme = parts.scheme.lower()
            if scheme not in ("http", "https"):
                raise ValueError(f"unknown url type: {self.masked(url)!r}")
            host = parts.hostname
            if not host:
                raise ValueError(f"no host given: {self.masked(url)!r}")
            port = parts.port or (443 if scheme == "https" else 80)
            target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
            given = json.loads(headers)
            names = {name.lower() for name in given}
            if "content-type" not in names:
                given["Content-Type"] = "application/json"
            if "user-agent" not in names:
                given["User-Agent"] = "pgmb-dispatcher"
            if parts.username is not None:
                credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
                given["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
            # As bytes: http.client would encode text as Latin-1. pgmb's headers are ASCII
            # (pgmb.run_headers), so anything else is a request pgmb could not build.
            sent = {
                str(name).encode("ascii"): str(value).encode("ascii")
                for name, value in given.items()
            }
            data = body.encode()
        except Exception as exc:
            return failure(Unbuildable(f"{type(exc).__name__}: {exc}"), timeout, started)
        key = (scheme, host, port)
        request = Request(key, target, sent, data, timeout, started, self.take(key))
        try:
            while True:
                try:
                    self.write(request)
                    return request
                except STALE:
                    if request.conn is not None:
                        request.conn.close()
                    request.conn = None
                    if not request.reused:
                        raise
                    request.reused = False  # once more, on a new connection
        except Exception as exc:  # timeouts, refusals, resets: no request sent
            if request.conn is not None:
                request.conn.close()
            return failure(exc, timeout, started)

    def write(self, request: Request) -> None:
        conn = request.conn
        scheme, host, port = request.key
        deadline = request.deadline
        # http.client's hook for how a connection connects (not in its typed interface).
        if conn is None:
            if scheme == "https":
                conn = http.client.HTTPSConnection(
                    host, port, timeout=left(deadline), context=self.tls_context()
                )
            else:
                conn = http.client.HTTPConnection(host, port, timeout=left(deadline))
            request.conn = conn
            conn._create_connection = self.connector(deadline)  # type: ignore[attr-defined]
            conn.connect()
        else:
            conn.timeout = request.timeout
            conn._create_connection = self.connector(deadline)  # type: ignore[attr-defined]
        cast(Deadlined, conn.sock).deadline = deadline
        # Header names and values as bytes, which http.client sends as they are (its typed
        # interface names text only).
        conn.request("POST", request.target, request.data, request.headers)  # type: ignore[arg-type]

    def receive(self, request: Request | Outcome) -> Outcome:
        """The outcome of a request send() returned: never an exception but an SPI error of
        pgmb.http_outcome (a cancel, say)."""
        if isinstance(request, tuple):
            return request
        started, timeout = request.started, request.timeout
        try:
            while True:
                try:
                    response = cast(http.client.HTTPConnection, request.conn).getresponse()
                    break
                except STALE:
                    # No answer came on a kept connection: once more on a fresh one
                    # (at-least-once: should the server have handled it, a duplicate).
                    cast(http.client.HTTPConnection, request.conn).close()
                    request.conn = None
                    if not request.reused:
                        raise
                    request.reused = False
                    self.write(request)
        except Exception as exc:  # timeouts, refusals, resets: no HTTP answer
            if request.conn is not None:
                request.conn.close()
            return failure(exc, timeout, started)
        conn = cast(http.client.HTTPConnection, request.conn)
        status = response.status
        reusable = not response.will_close
        try:
            if response.length is not None and response.length <= BODY_LIMIT:
                content = response.read()
            else:
                content = response.read(BODY_LIMIT)
                reusable = reusable and response.isclosed()  # read to its end, under the limit
        except Exception:  # the answer came; a body cut short only costs the connection
            content = b""
            reusable = False
        if reusable:
            self.keep(request.key, conn)
        else:
            conn.close()

        if 200 <= status <= 299:  # what pgmb.http_outcome makes of a success, without asking it
            return (status, "", None, (time.perf_counter() - started) * 1000)
        # 500 characters at most reach the outcome; 4 bytes a character at most. PostgreSQL
        # text holds no NUL.
        text = content[:2000].decode("utf-8", "replace").replace("\x00", "")
        location, retry_after = (
            None if value is None else value.replace("\x00", "")
            for value in (response.getheader("Location"), response.getheader("Retry-After"))
        )
        plan = self.gd.get(OUTCOME_PLAN_KEY)
        if plan is None:
            plan = self.gd[OUTCOME_PLAN_KEY] = self.plpy.prepare(
                "SELECT (o).* FROM (SELECT pgmb.http_outcome($1, $2, $3, $4, "
                "clock_timestamp() - $5 * interval '1 millisecond') AS o) s",
                ["integer", "text", "text", "text", "float8"],
            )
        duration = (time.perf_counter() - started) * 1000
        row = self.plpy.execute(plan, [status, text, location, retry_after, duration])[0]
        error = row["error"]
        if any(
            name.lower() == ABORT_HEADER.lower()
            and any(item.strip(" \t").lower() == ABORT_VALUE for item in value.split(","))
            for name, value in response.getheaders()
        ):
            error = ABORTED + error
        return (row["status"], error, row["retry_after"], row["duration_ms"])

    def post(self, url: str, body: str, headers: str, timeout: float) -> Outcome:
        """One POST (pgmb.post_via_plpython): its outcome, as receive() gives it."""
        return self.receive(self.send(url, body, headers, timeout))

    def interrupt_pending(self) -> Any:
        """The backend's InterruptPending flag (a ctypes int), or None where it cannot be
        read (then run() has pg_sleep(0) look at the interrupts)."""
        if INTERRUPT_PENDING_KEY not in self.gd:
            try:
                import ctypes

                self.gd[INTERRUPT_PENDING_KEY] = ctypes.c_int.in_dll(
                    ctypes.CDLL(None), "InterruptPending"
                )
            except Exception:
                self.gd[INTERRUPT_PENDING_KEY] = None
                self.gd[INTERRUPTS_PLAN_KEY] = self.plpy.prepare("SELECT pg_sleep(0)")
        return self.gd[INTERRUPT_PENDING_KEY]

    def run(
        self,
        urls: Sequence[str],
        bodies: Sequence[str],
        headers: Sequence[str],
        timeouts: Sequence[float],
        max_count: int,
        budget_ms: float,
        held_ms: float | None,
        guess_ms: float | None,
        deadline: float,
    ) -> list[RunOutcome]:
        """Posts in windows (pgmb.post_run_via_plpython, whose comment says how): the
        outcomes of the requests posted, in order, each with when it came."""
        # Python code never looks at the backend's interrupts: a cancel or a terminate that
        # came during a window would let the run post on. Before each next window the run
        # reads the backend's InterruptPending flag and, when it is set, ends: the loop's
        # next statement then acts on the interrupt. Where the flag cannot be read,
        # pg_sleep(0) looks at the interrupts instead (and raises, or exits).
        pending = self.interrupt_pending()
        outcomes: list[RunOutcome] = []
        oldest = None if held_ms is None else time.time() - held_ms / 1000.0
        guess = guess_ms or 0.0
        total = min(len(urls), max(max_count, 1))
        k = 0
        while k < total:
            if k:
                now = time.time()
                assert oldest is not None  # an outcome came, at the latest in the first window
                if now >= deadline or (now - oldest) * 1000.0 + guess >= budget_ms:
                    break
                if pending is None:
                    self.plpy.execute(self.gd[INTERRUPTS_PLAN_KEY])
                elif pending.value:
                    break
            # A window as wide as WINDOW only while answers come fast: the last window (or the
            # loop's last request) took under half of what the batch's time bound leaves, so
            # the outcomes a window holds back still wait about as long as one request's
            # would. Until an answer has been timed, and after a slow one, one request at a
            # time.
            remaining = budget_ms - ((time.time() - oldest) * 1000.0 if oldest is not None else 0.0)
            width = WINDOW if guess > 0 and guess * 2 < remaining else 1
            window_started = time.perf_counter()
            window = range(k, min(k + width, total))
            sent: list[Request | Outcome] = []
            for j in window:
                try:
                    sent.append(self.send(urls[j], bodies[j], headers[j], timeouts[j]))
                except Exception as exc:
                    sent.append(self.unsent(exc, window_started))
            for request in sent:
                try:
                    outcome = self.receive(request)
                except self.plpy.spiexceptions.QueryCanceled:
                    raise
                except Exception as exc:
                    outcome = self.unsent(exc, window_started)
                finished = time.time()
                if oldest is None:
                    oldest = finished
                outcomes.append((*outcome, finished))
            guess = (time.perf_counter() - window_started) * 1000.0
            k += len(window)
        return outcomes

    @staticmethod
    def unsent(exc: Exception, window_started: float) -> Outcome:
        """The outcome of a request of a run that send() or receive() raised on."""
        return (
            None,
            OWN_FAILURE + f"could not send the request: {exc}",
            None,
            (time.perf_counter() - window_started) * 1000,
        )
# Bump the suffix in the release whose migration changes the transport's code.
GD["pgmb_transport_v3"] = Transport(plpy, GD)
$py$;

-- One POST through PL/Python, where the http extension is missing but plpython3u is present:
-- no redirect followed, every failure an outcome, never an error (pgmb.post_via_http's
-- contract).
CREATE OR REPLACE FUNCTION pgmb.post_via_plpython(url text, body text, headers jsonb, timeout float8)
RETURNS pgmb.http_outcome
LANGUAGE plpython3u AS $py$
transport = GD.get("pgmb_transport_v3")
if transport is None:
    plpy.execute("SELECT pgmb.load_plpython_transport()")
    transport = GD["pgmb_transport_v3"]
return transport.post(url, body, headers, timeout)
$py$;

-- Posts urls[1], urls[2], ... in order and returns the outcomes of those it posted, in order
-- (finished: when each outcome came, seconds since the epoch). It sends a window of up to 8
-- requests, each on a connection of its own, then reads their answers in order; a request's
-- duration runs from its sending to its answer. A window is that wide only while answers
-- come fast (the last window took under half of the time the batch's bound leaves); until an
-- answer has been timed, and after a slow one, it holds one request. The first request is
-- always posted; before each next window the run stops once max_count are posted, once
-- deadline (seconds since the epoch) has passed, or once the oldest outcome not yet
-- committed would wait budget_ms or longer, counting the next window as lasting as long as
-- the one before (held_ms: how long the loop's oldest kept outcome has waited already, NULL
-- when none; guess_ms: the duration of the loop's last request). These are the in-database
-- loop's bounds of a batch (pgmb.indb_commit_bounds), so a run ends where the loop would
-- commit, and a window never holds more requests than max_count leaves.
--
-- A fault of one request is its outcome and never stops the run. A cancel
-- (pg_cancel_backend) or a terminate is not an outcome: it ends the call after the window in
-- flight, before the next.
CREATE OR REPLACE FUNCTION pgmb.post_run_via_plpython(
    urls text[], bodies text[], headers jsonb[], timeouts float8[],
    max_count integer, budget_ms float8, held_ms float8, guess_ms float8, deadline float8)
RETURNS TABLE (status integer, error text, retry_after float8, duration_ms float8, finished float8)
LANGUAGE plpython3u AS $py$
transport = GD.get("pgmb_transport_v3")
if transport is None:
    plpy.execute("SELECT pgmb.load_plpython_transport()")
    transport = GD["pgmb_transport_v3"]
return transport.run(urls, bodies, headers, timeouts, max_count, budget_ms, held_ms, guess_ms,
                     deadline)
$py$;

-- Only the owner of pgmb's functions and pgmb_admin post (access.sql): these are made by
-- whoever loads this file (a superuser, for an untrusted language), after access.sql closed
-- the others.
REVOKE EXECUTE ON FUNCTION pgmb.load_plpython_transport(),
    pgmb.post_via_plpython(text, text, jsonb, float8),
    pgmb.post_run_via_plpython(text[], text[], jsonb[], float8[], integer, float8, float8, float8, float8)
FROM PUBLIC;
DO $$
DECLARE
    r name;
BEGIN
    FOR r IN SELECT pg_get_userbyid(p.proowner) FROM pg_proc p
             WHERE p.oid = 'pgmb.post(text, text, jsonb, float8)'::regprocedure
             UNION SELECT rolname FROM pg_roles WHERE rolname = 'pgmb_admin' LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION pgmb.load_plpython_transport(), '
                       'pgmb.post_via_plpython(text, text, jsonb, float8), '
                       'pgmb.post_run_via_plpython(text[], text[], jsonb[], float8[], integer, float8, float8, float8, float8) '
                       'TO %I', r);
    END LOOP;
END $$;
