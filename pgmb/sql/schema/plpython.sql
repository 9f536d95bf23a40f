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
-- splice: plpython_transport.py
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
