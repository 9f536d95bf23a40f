-- The PL/Python transport posts a run of requests in one call (docs/decisions.md, "Runs of
-- requests in one PL/Python call"). Its code is defined once, by
-- pgmb.load_plpython_transport, which keeps it in PL/Python's GD; pgmb.post_via_plpython (one
-- request, same signature and outcomes as 0030's) and pgmb.post_run_via_plpython (a run) both
-- call it. Installed by the migration only when the plpython3u language exists in this
-- database; migrating back runs 0030_keepalive_transport.sql again.

-- The connections are kept in GD as by 0030's version (same key, same layout): a session that
-- crosses the upgrade keeps them.
CREATE OR REPLACE FUNCTION pgmb.load_plpython_transport()
RETURNS void
LANGUAGE plpython3u AS $py$
import http.client
import json
import select
import time
from urllib.parse import urlsplit

# A response body is read to its end so that its connection can carry the next request; past
# this many bytes closing the connection costs less than reading on.
BODY_LIMIT = 1 << 20
# Connections kept per backend, the least recently used closed first: a session that posts
# to many endpoints must not hold a socket open for each of them.
KEPT = 64

def post(url, body, headers, timeout):
    """One POST: an outcome (status, error, retry_after, duration_ms), never an exception
    but an SPI error of pgmb.http_outcome (a cancel, say)."""
    started = time.perf_counter()

    def failure(exc):
        if isinstance(exc, TimeoutError) or "timed out" in str(exc):
            return (None, "timeout after %gs" % timeout, None, (time.perf_counter() - started) * 1000)
        return (None, "%s: %s" % (type(exc).__name__, exc), None, (time.perf_counter() - started) * 1000)

    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise ValueError("unknown url type: %r" % url)
        host = parts.hostname
        if not host:
            raise ValueError("no host given: %r" % url)
        port = parts.port or (443 if scheme == "https" else 80)
        target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
        sent = json.loads(headers)
        names = {name.lower() for name in sent}
        if "content-type" not in names:
            sent["Content-Type"] = "application/json"
        if "user-agent" not in names:
            sent["User-Agent"] = "pgmb-dispatcher"
        data = body.encode()
    except Exception as exc:
        return failure(exc)

    # GD lives as long as the backend, and one backend runs one loop: no locking.
    pool = GD.get("pgmb_connections")
    if pool is None:
        pool = GD["pgmb_connections"] = {}
    key = (scheme, host, port)
    conn = pool.pop(key, None)
    try:
        if conn is not None:
            # An idle connection has nothing to say: readable means the server closed it (or
            # broke the protocol). Found now, it costs no request sent in vain. poll, not
            # select: a backend's descriptors may number past select's 1024.
            idle = select.poll()
            idle.register(conn.sock, select.POLLIN)
            if idle.poll(0):
                conn.close()
                conn = None
        reused = conn is not None
        while True:
            if conn is None:
                connection_class = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
                conn = connection_class(host, port, timeout=timeout)
            else:
                conn.timeout = timeout
                conn.sock.settimeout(timeout)
            try:
                conn.request("POST", target, data, sent)
                response = conn.getresponse()
                break
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                # RemoteDisconnected is a ConnectionResetError: no answer came. On a kept
                # connection the server most likely closed it just as the request went out:
                # once more on a fresh one (at-least-once: should the server have handled it,
                # a duplicate).
                conn.close()
                conn = None
                if not reused:
                    raise
                reused = False
    except Exception as exc:  # timeouts, refusals, resets: no HTTP answer
        if conn is not None:
            conn.close()
        return failure(exc)

    status = response.status
    keep = not response.will_close
    try:
        if response.length is not None and response.length <= BODY_LIMIT:
            content = response.read()
        else:
            content = response.read(BODY_LIMIT)
            keep = keep and response.isclosed()  # read to its end, under the limit
    except Exception:  # the answer came; a body cut short only costs the connection
        content = b""
        keep = False
    if keep:
        pool[key] = conn
        while len(pool) > KEPT:
            pool.pop(next(iter(pool))).close()
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

# Named after this migration: a later version of this function stores its own, so a session
# that crosses an upgrade never runs the code of the one before.
GD["pgmb_post_0031"] = post
$py$;

-- One POST through PL/Python, where the http extension is missing but plpython3u is present.
-- Same signature and contract as 0030's: one POST, no redirect followed, every failure an
-- outcome, never an error.
CREATE OR REPLACE FUNCTION pgmb.post_via_plpython(url text, body text, headers jsonb, timeout float8)
RETURNS pgmb.http_outcome
LANGUAGE plpython3u AS $py$
post = GD.get("pgmb_post_0031")
if post is None:
    plpy.execute("SELECT pgmb.load_plpython_transport()")
    post = GD["pgmb_post_0031"]
return post(url, body, headers, timeout)
$py$;

-- Posts urls[1], urls[2], ... in order, back to back, and returns the outcomes of those it
-- posted, in order (finished: when each outcome came, seconds since the epoch). The first is
-- always posted; before each next one it stops once max_count are posted, once deadline
-- (seconds since the epoch) has passed, or once the oldest outcome not yet committed would
-- wait budget_ms or longer, counting the next request as lasting as long as the one before
-- (held_ms: how long the loop's oldest kept outcome has waited already, NULL when none;
-- guess_ms: the duration of the loop's last request). These are the in-database loop's
-- bounds of a batch (pgmb.indb_commit_bounds), so a run ends where the loop would commit.
--
-- A fault of one request is its outcome and never stops the run: the loop posting one
-- request at a time recorded 'could not send the request: ...' for an error, and so does
-- this. A cancel (pg_cancel_backend) or a terminate is not an outcome: it ends the call
-- after the request in flight, before the next.
CREATE OR REPLACE FUNCTION pgmb.post_run_via_plpython(
    urls text[], bodies text[], headers jsonb[], timeouts float8[],
    max_count integer, budget_ms float8, held_ms float8, guess_ms float8, deadline float8)
RETURNS TABLE (status integer, error text, retry_after float8, duration_ms float8, finished float8)
LANGUAGE plpython3u AS $py$
import time

post = GD.get("pgmb_post_0031")
if post is None:
    plpy.execute("SELECT pgmb.load_plpython_transport()")
    post = GD["pgmb_post_0031"]

# Python code never looks at the backend's interrupts: a cancel or a terminate that came
# during a request would let the run post on. Before each next request the run reads the
# backend's InterruptPending flag and, when it is set, ends: the loop's next statement then
# acts on the interrupt, as it did after each request. Where the flag cannot be read,
# pg_sleep(0) looks at the interrupts instead (and raises, or exits), at ~30 us a request.
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
for k in range(min(len(urls), max(max_count, 1))):
    if k:
        now = time.time()
        if now >= deadline or (now - oldest) * 1000.0 + guess >= budget_ms:
            break
        if pending is None:
            plpy.execute(GD["pgmb_interrupts_plan"])
        elif pending.value:
            break
    started = time.perf_counter()
    try:
        outcome = post(urls[k], bodies[k], headers[k], timeouts[k])
    except plpy.spiexceptions.QueryCanceled:
        raise
    except Exception as exc:
        outcome = (None, "could not send the request: %s" % exc, None, (time.perf_counter() - started) * 1000)
    finished = time.time()
    guess = (time.perf_counter() - started) * 1000.0
    if oldest is None:
        oldest = finished
    outcomes.append(outcome + (finished,))
return outcomes
$py$;
