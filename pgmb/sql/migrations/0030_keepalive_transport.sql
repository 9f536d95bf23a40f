-- POST through PL/Python over kept-alive connections (docs/decisions.md, "A keep-alive
-- PL/Python transport"). The version of 0001_transport_plpython opened a TCP connection for
-- every request, which was most of the in-database loop's cost per delivery. Same signature
-- and contract: one POST, no redirect followed, every failure an outcome, never an error.
-- Installed by the migration only when the plpython3u language exists in this database.
CREATE OR REPLACE FUNCTION pgmb.post_via_plpython(url text, body text, headers jsonb, timeout float8)
RETURNS pgmb.http_outcome
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
        # broke the protocol). Found now, it costs no request sent in vain. poll, not select:
        # a backend's descriptors may number past select's 1024.
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
            # RemoteDisconnected is a ConnectionResetError: no answer came. On a kept connection
            # the server most likely closed it just as the request went out: once more on a
            # fresh one (at-least-once: should the server have handled it, a duplicate).
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
$py$;
