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

-- A request's timeout is a total deadline (docs/delivery.md): connecting, the TLS
-- handshake, sending and reading its answer all end by then. Socket timeouts bound one
-- operation each, so the transport's sockets set what is left of the deadline before each
-- one: a server that sends an answer a byte at a time cannot hold the backend past it. A connection is made only to
-- an address the database's endpoint policy allows (pgmb.endpoint_refused, checked after
-- name resolution, on the address connected to), so an answer that changes after a check
-- cannot reach a refused address. Name resolution ends by the deadline too: a name is
-- resolved in a thread of the transport's (a few at most, kept for the session), which the
-- request stops waiting for at its deadline, so a resolver that does not answer costs the
-- request its timeout, not the resolver's own retries.
--
-- A URL's user and password are sent as Basic credentials, as pgmb_dispatch sends them.
-- What the transport cannot build or encode, and an address the policy refuses, is a failure
-- of pgmb's own (its error begins "pgmb's own failure: ", pgmb.own_failure): never the
-- endpoint's (breakers.sql).
--
-- Defines the transport's code once per session, in PL/Python's GD under keys that carry
-- its version (a session that crosses an upgrade closes the connections it kept under an
-- older version's keys): pgmb.post_via_plpython posts one request with it,
-- pgmb.post_run_via_plpython a run in windows. Connections are kept in lists, several per
-- endpoint.
CREATE OR REPLACE FUNCTION pgmb.load_plpython_transport()
RETURNS void
LANGUAGE plpython3u AS $py$
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

# GD lives as long as the backend, and one backend runs one loop: no locking.
pool = GD.setdefault("pgmb_connections_v1", {})

class Refused(OSError):
    """The endpoint's name resolves to no address the endpoint policy allows."""

class Unbuildable(Exception):
    """The request could not be built or encoded: nothing was sent."""

def resolvers():
    """The session's resolver threads. They are started with every signal blocked, so that
    the signals PostgreSQL sends the backend reach its own thread only."""
    executor = GD.get("pgmb_resolvers_v2")
    if executor is None:
        executor = GD["pgmb_resolvers_v2"] = concurrent.futures.ThreadPoolExecutor(
            RESOLVERS, thread_name_prefix="pgmb-resolve")
    return executor

def resolve(host, port, deadline):
    """socket.getaddrinfo of host, by deadline. An address literal is read at once."""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    else:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    executor = resolvers()
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

def left(deadline):
    """Seconds left until deadline (time.monotonic()); TimeoutError when none."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("timed out")
    return remaining

class DeadlineSocket(socket.socket):
    """A socket whose every send and receive ends by its request's deadline. Past it, what
    has already arrived is still read (a window's later answers wait in their sockets while
    an earlier one is read), but nothing is waited for."""
    deadline = None

    def _bound(self):
        if self.deadline is not None:
            self.settimeout(max(self.deadline - time.monotonic(), 1e-6))

    def recv_into(self, *args):
        self._bound()
        return super().recv_into(*args)

    def recv(self, *args):
        self._bound()
        return super().recv(*args)

    def sendall(self, *args):
        self._bound()
        return super().sendall(*args)

    def send(self, *args):
        self._bound()
        return super().send(*args)

class DeadlineSSLSocket(ssl.SSLSocket):
    """The same over TLS (ssl.SSLContext.sslsocket_class)."""
    deadline = None
    _bound = DeadlineSocket._bound

    def recv_into(self, *args):
        self._bound()
        return super().recv_into(*args)

    def recv(self, *args):
        self._bound()
        return super().recv(*args)

    def read(self, *args):
        self._bound()
        return super().read(*args)

    def sendall(self, *args):
        self._bound()
        return super().sendall(*args)

    def send(self, *args):
        self._bound()
        return super().send(*args)

    def write(self, *args):
        self._bound()
        return super().write(*args)

def tls_context():
    context = GD.get("pgmb_tls_context_v1")
    if context is None:
        context = GD["pgmb_tls_context_v1"] = ssl.create_default_context()
        context.sslsocket_class = DeadlineSSLSocket
    return context

def refused(address):
    plan = GD.get("pgmb_refused_plan")
    if plan is None:
        plan = GD["pgmb_refused_plan"] = plpy.prepare(
            "SELECT pgmb.endpoint_refused($1::inet) AS refused", ["text"])
    return plpy.execute(plan, [address.split("%", 1)[0]])[0]["refused"]

def connector(deadline):
    """http.client's _create_connection: resolves, keeps the addresses the policy allows
    and connects to those only, by deadline."""
    def create_connection(address, timeout=None, source_address=None, *args):
        host, port = address
        infos = resolve(host, port, deadline)
        kept = [info for info in infos if not refused(info[4][0])]
        if infos and not kept:
            raise Refused("%s resolves to %s, which the endpoint policy (pgmb.endpoint_policy) refuses"
                          % (host, ", ".join(sorted({info[4][0] for info in infos}))))
        error = OSError("no address for %s" % host)
        for family, kind, proto, _, sockaddr in kept:
            sock = DeadlineSocket(family, kind, proto)
            try:
                sock.settimeout(left(deadline))
                sock.connect(sockaddr)
                # What is left after connecting: HTTPSConnection wraps this socket with its
                # timeout, which the ssl module takes as the handshake's total duration, so
                # the handshake ends by the request's deadline too, not a timeout later.
                sock.settimeout(left(deadline))
                sock.deadline = deadline
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error
    return create_connection

def take(key):
    """A kept connection to key, or None. An idle connection has nothing to say: readable
    means the server closed it (or broke the protocol). Found now, it costs no request sent
    in vain. poll, not select: a backend's descriptors may number past select's 1024."""
    kept = pool.get(key)
    while kept:
        conn = kept.pop()
        if not kept:
            del pool[key]
        idle = select.poll()
        idle.register(conn.sock, select.POLLIN)
        if not idle.poll(0):
            return conn
        conn.close()
    return None

def keep(key, conn):
    kept = pool.pop(key, None) or []
    kept.append(conn)
    pool[key] = kept  # last: the most recently used endpoint
    while sum(len(conns) for conns in pool.values()) > KEPT:
        oldest = next(iter(pool))
        pool[oldest].pop(0).close()
        if not pool[oldest]:
            del pool[oldest]

def failure(exc, timeout, started):
    if isinstance(exc, Refused):
        return (None, OWN_FAILURE + "connection failed: %s" % exc, None, (time.perf_counter() - started) * 1000)
    if isinstance(exc, Unbuildable):
        return (None, OWN_FAILURE + "could not build the request: %s" % exc, None,
                (time.perf_counter() - started) * 1000)
    if isinstance(exc, TimeoutError) or "timed out" in str(exc):
        return (None, "timeout after %gs" % timeout, None, (time.perf_counter() - started) * 1000)
    return (None, "%s: %s" % (type(exc).__name__, exc), None, (time.perf_counter() - started) * 1000)

def masked(url):
    """The URL as errors show it: credentials masked, as pgmb.mask_credentials does (errors
    are stored, and shown in the admin)."""
    plan = plpy.prepare("SELECT pgmb.mask_credentials($1) AS url", ["text"])
    return plpy.execute(plan, [url])[0]["url"]

def send(url, body, headers, timeout):
    """Sends one POST. Returns what receive() needs to read its answer, or, when no request
    could be sent, its outcome (a tuple)."""
    started = time.perf_counter()
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise ValueError("unknown url type: %r" % masked(url))
        host = parts.hostname
        if not host:
            raise ValueError("no host given: %r" % masked(url))
        port = parts.port or (443 if scheme == "https" else 80)
        target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
        given = json.loads(headers)
        names = {name.lower() for name in given}
        if "content-type" not in names:
            given["Content-Type"] = "application/json"
        if "user-agent" not in names:
            given["User-Agent"] = "pgmb-dispatcher"
        if parts.username is not None:
            credentials = "%s:%s" % (unquote(parts.username), unquote(parts.password or ""))
            given["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
        # As bytes: http.client would encode text as Latin-1. pgmb's headers are ASCII
        # (pgmb.run_headers), so anything else is a request pgmb could not build.
        sent = {str(name).encode("ascii"): str(value).encode("ascii") for name, value in given.items()}
        data = body.encode()
    except Exception as exc:
        return failure(Unbuildable("%s: %s" % (type(exc).__name__, exc)), timeout, started)
    request = {"key": (scheme, host, port), "target": target, "headers": sent, "data": data,
               "timeout": timeout, "started": started, "conn": take((scheme, host, port)),
               "deadline": time.monotonic() + timeout}
    request["reused"] = request["conn"] is not None
    try:
        while True:
            try:
                _write(request)
                return request
            except STALE:
                request["conn"].close()
                request["conn"] = None
                if not request["reused"]:
                    raise
                request["reused"] = False  # once more, on a new connection
    except Exception as exc:  # timeouts, refusals, resets: no request sent
        if request["conn"] is not None:
            request["conn"].close()
        return failure(exc, timeout, started)

def _write(request):
    conn = request["conn"]
    scheme, host, port = request["key"]
    deadline = request["deadline"]
    if conn is None:
        if scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=left(deadline), context=tls_context())
        else:
            conn = http.client.HTTPConnection(host, port, timeout=left(deadline))
        request["conn"] = conn
        conn._create_connection = connector(deadline)
        conn.connect()
    else:
        conn.timeout = request["timeout"]
        conn._create_connection = connector(deadline)
    conn.sock.deadline = deadline
    conn.request("POST", request["target"], request["data"], request["headers"])

def receive(request):
    """The outcome (status, error, retry_after, duration_ms) of a request send() returned:
    never an exception but an SPI error of pgmb.http_outcome (a cancel, say)."""
    if isinstance(request, tuple):
        return request
    started, timeout = request["started"], request["timeout"]
    try:
        while True:
            try:
                response = request["conn"].getresponse()
                break
            except STALE:
                # No answer came on a kept connection: once more on a fresh one
                # (at-least-once: should the server have handled it, a duplicate).
                request["conn"].close()
                request["conn"] = None
                if not request["reused"]:
                    raise
                request["reused"] = False
                _write(request)
    except Exception as exc:  # timeouts, refusals, resets: no HTTP answer
        if request["conn"] is not None:
            request["conn"].close()
        return failure(exc, timeout, started)
    conn = request["conn"]
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
        keep(request["key"], conn)
    else:
        conn.close()

    if 200 <= status <= 299:  # what pgmb.http_outcome makes of a success, without asking it
        return (status, "", None, (time.perf_counter() - started) * 1000)
    # 500 characters at most reach the outcome; 4 bytes a character at most. PostgreSQL text
    # holds no NUL.
    text = content[:2000].decode("utf-8", "replace").replace("\x00", "")
    location, retry_after = (
        None if value is None else value.replace("\x00", "")
        for value in (response.getheader("Location"), response.getheader("Retry-After")))
    plan = GD.get("pgmb_outcome_plan")
    if plan is None:
        plan = GD["pgmb_outcome_plan"] = plpy.prepare(
            "SELECT (o).* FROM (SELECT pgmb.http_outcome($1, $2, $3, $4, clock_timestamp() - $5 * interval '1 millisecond') AS o) s",
            ["integer", "text", "text", "text", "float8"])
    row = plpy.execute(plan, [status, text, location, retry_after, (time.perf_counter() - started) * 1000])[0]
    return (row["status"], row["error"], row["retry_after"], row["duration_ms"])

def post(url, body, headers, timeout):
    """One POST: its outcome, as receive() gives it."""
    return receive(send(url, body, headers, timeout))

# Versioned names (bump the suffix in the release whose migration changes this code): a
# later version of these functions stores its own, so a session that crosses an upgrade
# never runs the code of the one before.
GD["pgmb_post_v2"] = post
GD["pgmb_send_v2"] = send
GD["pgmb_receive_v2"] = receive
$py$;

-- One POST through PL/Python, where the http extension is missing but plpython3u is present:
-- no redirect followed, every failure an outcome, never an error (pgmb.post_via_http's
-- contract).
CREATE OR REPLACE FUNCTION pgmb.post_via_plpython(url text, body text, headers jsonb, timeout float8)
RETURNS pgmb.http_outcome
LANGUAGE plpython3u AS $py$
post = GD.get("pgmb_post_v2")
if post is None:
    plpy.execute("SELECT pgmb.load_plpython_transport()")
    post = GD["pgmb_post_v2"]
return post(url, body, headers, timeout)
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
import time

# Requests in flight at once. Measured on a 2-core machine against nginx: 8 posted 2.3-3x
# as many requests a second as 1, and 16 no more than 8 (docs/benchmarks.md).
WINDOW = 8

send = GD.get("pgmb_send_v2")
if send is None:
    plpy.execute("SELECT pgmb.load_plpython_transport()")
    send = GD["pgmb_send_v2"]
receive = GD["pgmb_receive_v2"]

# Python code never looks at the backend's interrupts: a cancel or a terminate that came
# during a window would let the run post on. Before each next window the run reads the
# backend's InterruptPending flag and, when it is set, ends: the loop's next statement then
# acts on the interrupt. Where the flag cannot be read, pg_sleep(0) looks at the interrupts
# instead (and raises, or exits).
if "pgmb_interrupt_pending" not in GD:
    try:
        import ctypes
        GD["pgmb_interrupt_pending"] = ctypes.c_int.in_dll(ctypes.CDLL(None), "InterruptPending")
    except Exception:
        GD["pgmb_interrupt_pending"] = None
        GD["pgmb_interrupts_plan"] = plpy.prepare("SELECT pg_sleep(0)")
pending = GD["pgmb_interrupt_pending"]

outcomes = []
oldest = None if held_ms is None else time.time() - held_ms / 1000.0
guess = guess_ms or 0.0
total = min(len(urls), max(max_count, 1))
k = 0
while k < total:
    if k:
        now = time.time()
        if now >= deadline or (now - oldest) * 1000.0 + guess >= budget_ms:
            break
        if pending is None:
            plpy.execute(GD["pgmb_interrupts_plan"])
        elif pending.value:
            break
    # A window as wide as WINDOW only while answers come fast: the last window (or the
    # loop's last request) took under half of what the batch's time bound leaves, so the
    # outcomes a window holds back still wait about as long as one request's would. Until
    # an answer has been timed, and after a slow one, one request at a time.
    left = budget_ms - ((time.time() - oldest) * 1000.0 if oldest is not None else 0.0)
    width = WINDOW if 0 < guess and guess * 2 < left else 1
    window_started = time.perf_counter()
    window = range(k, min(k + width, total))
    sent = []
    for j in window:
        try:
            sent.append(send(urls[j], bodies[j], headers[j], timeouts[j]))
        except Exception as exc:
            sent.append((None, "pgmb's own failure: could not send the request: %s" % exc, None,
                         (time.perf_counter() - window_started) * 1000))
    for request in sent:
        try:
            outcome = receive(request)
        except plpy.spiexceptions.QueryCanceled:
            raise
        except Exception as exc:
            outcome = (None, "pgmb's own failure: could not send the request: %s" % exc, None,
                       (time.perf_counter() - window_started) * 1000)
        finished = time.time()
        if oldest is None:
            oldest = finished
        outcomes.append(outcome + (finished,))
    guess = (time.perf_counter() - window_started) * 1000.0
    k += len(window)
return outcomes
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
