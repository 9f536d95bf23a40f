-- Migrating back from 0030: the transport of 0001_transport_plpython again (a new connection
-- per request), so that a database at 0029 runs the code of 0029 (docs/decisions.md).
-- POST through PL/Python, where the http extension is missing but plpython3u is present.
-- Installed by the migration only when the plpython3u language exists in this database.
CREATE OR REPLACE FUNCTION pgmb.post_via_plpython(url text, body text, headers jsonb, timeout float8)
RETURNS pgmb.http_outcome
LANGUAGE plpython3u AS $py$
import json
import time
import urllib.error
import urllib.request

opener = GD.get("pgmb_opener")
if opener is None:
    class NoRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None  # a 3xx comes back as an HTTPError, like any failure

    opener = GD["pgmb_opener"] = urllib.request.build_opener(NoRedirects)

started = time.perf_counter()
request = urllib.request.Request(url, data=body.encode(), method="POST", headers=json.loads(headers))
try:
    with opener.open(request, timeout=timeout) as response:
        response.read(1)
        status, content, location, retry_after = response.status, "", None, None
except urllib.error.HTTPError as exc:
    status = exc.code
    content = exc.read(500).decode("utf-8", "replace")
    location, retry_after = exc.headers.get("Location"), exc.headers.get("Retry-After")
except Exception as exc:  # timeouts, refusals, resets: no HTTP answer
    reason = getattr(exc, "reason", exc)
    text = "timeout after %gs" % timeout if "timed out" in str(reason) else "%s: %s" % (type(exc).__name__, reason)
    return (None, text, None, (time.perf_counter() - started) * 1000)

plan = GD.get("pgmb_outcome_plan")
if plan is None:
    plan = GD["pgmb_outcome_plan"] = plpy.prepare(
        "SELECT (o).* FROM (SELECT pgmb.http_outcome($1, $2, $3, $4, clock_timestamp() - $5 * interval '1 millisecond') AS o) s",
        ["integer", "text", "text", "text", "float8"])
row = plpy.execute(plan, [status, content, location, retry_after, (time.perf_counter() - started) * 1000])[0]
return (row["status"], row["error"], row["retry_after"], row["duration_ms"])
$py$;
