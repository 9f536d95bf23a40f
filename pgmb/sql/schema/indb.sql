-- The in-database dispatch path: pgmb.dispatch_loop claims, posts through the http
-- extension or the PL/Python transport (plpython.sql), signs requests like
-- pgmb/worker_request.py, records outcomes in batches, and is scheduled by pg_cron where
-- it is installed (pgmb.cron_install). Each part is optional: `manage.py check` says what
-- this database lacks.

-- HMAC-SHA256 from core sha256() (RFC 2104), so signing needs no pgcrypto.
CREATE OR REPLACE FUNCTION pgmb.hmac_sha256(key bytea, data bytea) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    k bytea := CASE WHEN length(key) > 64 THEN sha256(key) ELSE key END;
    inner_pad bytea;
    outer_pad bytea;
BEGIN
    k := k || decode(repeat('00', 64 - length(k)), 'hex');
    inner_pad := k;
    outer_pad := k;
    FOR i IN 0..63 LOOP
        inner_pad := set_byte(inner_pad, i, get_byte(k, i) # 54);   -- 0x36
        outer_pad := set_byte(outer_pad, i, get_byte(k, i) # 92);   -- 0x5c
    END LOOP;
    RETURN sha256(outer_pad || sha256(inner_pad || data));
END $$;

-- The in-database loop's constants, each named once: the SQL twin of a Python value, compared
-- by one table of cases (tests/rules/test_loop_constants.py). IMMUTABLE SQL, so the planner
-- folds each into the statement that names it: naming one costs no call.

-- Workers allowed this many requests a second or more are not paced (pgmb.dispatch.pacing.UNPACED_RPS).
CREATE OR REPLACE FUNCTION pgmb.unpaced_rps() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1000 $$;

-- Between a dispatcher's heartbeats (pgmb.conf.Settings.DISPATCH_HEARTBEAT_INTERVAL's default).
CREATE OR REPLACE FUNCTION pgmb.indb_heartbeat_interval() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '5 seconds' $$;

-- Between reclaims of leases that ran out (pgmb.conf.Settings.DISPATCH_RECLAIM_INTERVAL's default).
CREATE OR REPLACE FUNCTION pgmb.indb_reclaim_interval() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '5 seconds' $$;

-- Deliveries the loop claims at a time when no batch is given (pgmb.indb.DEFAULT_BATCH, the
-- default of manage.py pgmb_cron install --batch).
CREATE OR REPLACE FUNCTION pgmb.indb_batch() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 50 $$;

-- The outcome of an HTTP answer, as pgmb/dispatch/client.py classifies it. PL/pgSQL, not
-- SQL: a SQL function that cannot be inlined (clock_timestamp() in a STABLE one) is parsed
-- again in every subtransaction, and each request runs in one; PL/pgSQL keeps its plan.
CREATE OR REPLACE FUNCTION pgmb.http_outcome(status integer, content text, location text, retry_after text,
                                             started timestamptz, body_limit integer DEFAULT 500)
RETURNS pgmb.http_outcome
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN ROW(status,
               CASE WHEN status BETWEEN 200 AND 299 THEN ''
                    ELSE trim(format('HTTP %s%s: %s', status,
                                     CASE WHEN status BETWEEN 300 AND 399
                                          THEN format(' redirect to %s (not followed)', coalesce(location, '?')) ELSE '' END,
                                     left(coalesce(content, ''), body_limit))) END,
               CASE WHEN status IN (429, 503) THEN pgmb.retry_after_seconds(retry_after) END,
               extract(epoch FROM clock_timestamp() - started) * 1000)::pgmb.http_outcome;
END $$;

-- The networks the default endpoint policy refuses: pgmb.conf.DEFAULT_ENDPOINT_POLICY's
-- deny list (link-local, the metadata services, also through NAT64 and 6to4; one table of
-- cases compares them, tests/rules/test_endpoint_presets.py).
CREATE OR REPLACE FUNCTION pgmb.default_endpoint_deny() RETURNS cidr[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '{169.254.0.0/16,fe80::/10,fd00:ec2::254/128,100.100.100.200/32,64:ff9b::a9fe:0/112,64:ff9b::6464:64c8/128,2002:a9fe::/32,2002:6464:64c8::/48}'::cidr[]
$$;

-- The endpoint policy of the in-database path (docs/security.md, Endpoints): the networks
-- PGMB['ENDPOINT_POLICY'] allows and denies, written by manage.py pgmb_cron install and the
-- migration (pgmb.indb.write_endpoint_policy); the system check says when it differs from
-- the setting. One row; until written, the default policy.
CREATE TABLE IF NOT EXISTS pgmb.endpoint_policy (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    allow cidr[] NOT NULL DEFAULT '{}',
    deny cidr[] NOT NULL DEFAULT pgmb.default_endpoint_deny()
);
INSERT INTO pgmb.endpoint_policy DEFAULT VALUES ON CONFLICT DO NOTHING;

-- How far pgmb_trace_export has read the in-database loop's attempts (pgmb_attempt.indb), in
-- the order (created_at, id): one row, none before its first run. Its run locks it, so that
-- two exporters take turns and export each attempt once.
CREATE TABLE IF NOT EXISTS pgmb.trace_export (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    recorded_at timestamptz NOT NULL,
    attempt_id bigint NOT NULL
);

-- The rule of pgmb.endpoint_policy.Policy.refuses (one table of cases runs both,
-- tests/security/test_endpoint_policy.py): an address in an allowed network is reachable,
-- else one in a denied network is refused, else it is reachable. An IPv4-mapped IPv6
-- address is judged as the IPv4 address it carries.
CREATE OR REPLACE FUNCTION pgmb.endpoint_refused(address inet, allow cidr[], deny cidr[])
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT NOT EXISTS (SELECT FROM unnest(allow) AS n WHERE a <<= n)
       AND EXISTS (SELECT FROM unnest(deny) AS n WHERE a <<= n)
    FROM (SELECT CASE WHEN family(address) = 6 AND address <<= '::ffff:0.0.0.0/96'::inet
                      THEN '0.0.0.0'::inet + (address - '::ffff:0.0.0.0'::inet)
                      ELSE address END AS a) AS mapped
$$;

-- Whether the database's endpoint policy refuses address (the PL/Python transport asks
-- before it connects).
CREATE OR REPLACE FUNCTION pgmb.endpoint_refused(address inet) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT pgmb.endpoint_refused(address, p.allow, p.deny)
                     FROM pgmb.endpoint_policy AS p),
                    pgmb.endpoint_refused(address, '{}', pgmb.default_endpoint_deny()))
$$;

-- Whether the database's endpoint policy is the default one. pgsql-http resolves, connects
-- and follows redirects inside libcurl, where no policy can be checked: it is used only
-- under the default policy (whose link-local refusal it cannot enforce either; the
-- documented gap of the default).
CREATE OR REPLACE FUNCTION pgmb.endpoint_policy_is_default() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT p.allow = '{}' AND p.deny = pgmb.default_endpoint_deny()
                     FROM pgmb.endpoint_policy AS p), true)
$$;

-- The headers of requests as pgsql-http takes them: for each jsonb object of headers, the
-- text of an http_header[] (field, value), Content-Type left out (pgsql-http sets it from
-- the request's content_type). Text, not http_header[], so that this file installs without
-- the extension; NULL headers are none, an element that is neither NULL nor an object is
-- NULL. One statement for a claim's requests (pgmb.dispatch_loop), or one request's
-- (pgmb.post_via_http). PL/pgSQL, not SQL: a SQL function it cannot inline is parsed and
-- planned again in every subtransaction it is called in (pgmb.loop_post's, a request).
CREATE OR REPLACE FUNCTION pgmb.http_header_records(headers jsonb[]) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN ARRAY(
        SELECT CASE WHEN h.h IS NULL OR jsonb_typeof(h.h) = 'object' THEN (
                   SELECT coalesce(array_agg(ROW(e.k, e.v)), '{}')::text
                   FROM jsonb_each_text(h.h) AS e(k, v) WHERE lower(e.k) <> 'content-type') END
        FROM unnest(headers) WITH ORDINALITY AS h(h, n)
        ORDER BY h.n);
END $$;

-- Its generic plan from the first call: a custom plan, made at every call, cost more than
-- the statement itself (the estimate of a one-element array always favoured one).
ALTER FUNCTION pgmb.http_header_records(jsonb[]) SET plan_cache_mode = force_generic_plan;

-- POST through pgsql-http, the headers given as pgmb.http_header_records makes them. The
-- call is one expression, which PL/pgSQL evaluates without starting an executor (a
-- statement's would cost about half as much as pgsql-http's own work on a kept
-- connection), its answer kept in a record: PL/pgSQL resolves http() and its types when
-- the expression first runs, so this file installs without the extension. pgsql-http
-- follows redirects itself (up to 5) and has no option to stop it. Its curl options last
-- for the session, whatever becomes of the transaction: the timeout is set only when it
-- differs from the one this session last set (pgmb.http_timeout_ms; a rollback forgets
-- it, so it is then set again, never left stale). A fault of the request (refused, timed
-- out, no answer) is its outcome.
CREATE OR REPLACE FUNCTION pgmb.post_via_http_headers(url text, body text, header_records text, timeout float8)
RETURNS pgmb.http_outcome
LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz := clock_timestamp();
    -- Outside the subtransaction: a timeout no client takes is pgmb's own fault (the
    -- caller's), not the request's.
    timeout_ms text := ceil(timeout * 1000)::bigint::text;
    answer record;
    answer_location text;
    answer_retry_after text;
    aborted boolean;
    outcome pgmb.http_outcome;
BEGIN
    BEGIN
        IF current_setting('pgmb.http_timeout_ms', true) IS DISTINCT FROM timeout_ms THEN
            PERFORM http_set_curlopt('CURLOPT_TIMEOUT_MS', timeout_ms);
            PERFORM set_config('pgmb.http_timeout_ms', timeout_ms, false);
        END IF;
        answer := http(ROW('POST', url, header_records::http_header[], 'application/json', body)::http_request);
        -- The answer's headers are looked through only for a failure, in one pass: its
        -- outcome reads the first Location (3xx) and Retry-After (429, 503), and the abort
        -- header (pgmb.abort_header) ends its delivery at once.
        IF answer.status NOT BETWEEN 200 AND 299 THEN
            SELECT (array_agg(h.value) FILTER (WHERE lower(h.field) = 'location'))[1],
                   (array_agg(h.value) FILTER (WHERE lower(h.field) = 'retry-after'))[1],
                   -- The header is a list (RFC 9110, 5.6.1): any item of it will do.
                   coalesce(bool_or(lower(h.field) = pgmb.abort_header()
                                    AND lower(h.value) ~ ('(^|,)[ \t]*' || pgmb.abort_value() || '[ \t]*(,|$)')),
                            false)
            INTO answer_location, answer_retry_after, aborted
            FROM unnest(answer.headers) AS h;
        END IF;
    EXCEPTION WHEN others THEN
        RETURN ROW(NULL, 'HTTP request failed: ' || SQLERRM, NULL,
                   extract(epoch FROM clock_timestamp() - started) * 1000)::pgmb.http_outcome;
    END;
    -- Outside the subtransaction, which need only cover the call.
    outcome := pgmb.http_outcome(answer.status, answer.content, answer_location, answer_retry_after, started);
    IF aborted THEN
        outcome.error := pgmb.aborted_prefix() || outcome.error;
    END IF;
    RETURN outcome;
END $$;

-- POST through pgsql-http, the headers a jsonb object (pgmb.post's arguments, 0.1.1's).
CREATE OR REPLACE FUNCTION pgmb.post_via_http(url text, body text, headers jsonb, timeout float8)
RETURNS pgmb.http_outcome
LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz := clock_timestamp();
    header_records text;
BEGIN
    BEGIN
        header_records := (pgmb.http_header_records(ARRAY[headers]))[1];
        IF header_records IS NULL THEN
            RAISE EXCEPTION 'the headers are not a JSON object: %', left(headers::text, 100);
        END IF;
    EXCEPTION WHEN others THEN
        RETURN ROW(NULL, 'HTTP request failed: ' || SQLERRM, NULL,
                   extract(epoch FROM clock_timestamp() - started) * 1000)::pgmb.http_outcome;
    END;
    RETURN pgmb.post_via_http_headers(url, body, header_records, timeout);
END $$;

-- One POST through the database's transport (pgmb.http_transport): the http extension,
-- else PL/Python; an error says what to install when there is neither.
CREATE OR REPLACE FUNCTION pgmb.post(url text, body text, headers jsonb, timeout float8)
RETURNS pgmb.http_outcome
LANGUAGE plpgsql AS $$
BEGIN
    CASE pgmb.http_transport()
        WHEN 'http' THEN RETURN pgmb.post_via_http(url, body, headers, timeout);
        WHEN 'plpython3u' THEN
            RETURN pgmb.post_via_plpython(url, body, headers, timeout);
        ELSE
            PERFORM pgmb.no_transport();
    END CASE;
END $$;

-- The error of a database without a transport pgmb.post may use: none installed, or only
-- pgsql-http under an endpoint policy it cannot enforce.
CREATE OR REPLACE FUNCTION pgmb.no_transport() RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'http') THEN
        RAISE EXCEPTION 'pgmb: the http extension cannot enforce PGMB[''ENDPOINT_POLICY''] (it resolves, connects and follows redirects inside libcurl), so the in-database path does not use it under a policy other than the default'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Install plpython3u (pgmb''s PL/Python transport checks the policy), or run manage.py pgmb_dispatch instead.';
    END IF;
    RAISE EXCEPTION 'pgmb: no HTTP transport in this database'
        USING ERRCODE = 'feature_not_supported',
              HINT = 'Install the http extension (pgsql-http) or plpython3u, or run manage.py pgmb_dispatch instead.';
END $$;

-- Whether the pg_cron dispatch job exists (a running loop ends when it is unscheduled).
CREATE OR REPLACE FUNCTION pgmb.cron_job_scheduled() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    found boolean;
BEGIN
    IF to_regclass('cron.job') IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT EXISTS (SELECT 1 FROM cron.job WHERE jobname = ''pgmb-dispatch'' AND active)' INTO found;
    RETURN found;
END $$;

-- pg_cron's version here as an array (e.g. {1,4}), NULL if pg_cron is not in this database.
CREATE OR REPLACE FUNCTION pgmb.cron_version() RETURNS integer[]
LANGUAGE sql STABLE AS $$
    SELECT string_to_array(substring(extversion FROM '^[0-9.]+'), '.')::integer[]
    FROM pg_extension WHERE extname = 'pg_cron'
$$;

-- Schedule (or re-schedule) pgmb's jobs. pg_cron >= 1.5 runs a short loop every second;
-- 1.4 (Debian 12) has only minutes, so a per-minute job loops for 55 s.
CREATE OR REPLACE FUNCTION pgmb.cron_install(batch integer DEFAULT pgmb.indb_batch()) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    version integer[] := pgmb.cron_version();
    schedule text;
    command text;
BEGIN
    IF version IS NULL THEN
        RAISE EXCEPTION 'pg_cron is not installed in this database'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Preload it (shared_preload_libraries = ''pg_cron''), point cron.database_name here, then CREATE EXTENSION pg_cron.';
    END IF;
    IF version >= ARRAY[1, 5] THEN
        schedule := '1 seconds';
        command := format('CALL pgmb.dispatch_loop(0.9, %s, as_job => true)', batch);
    ELSE
        schedule := '* * * * *';
        command := format('CALL pgmb.dispatch_loop(55, %s, as_job => true)', batch);
    END IF;
    EXECUTE 'SELECT cron.schedule($1, $2, $3)' USING 'pgmb-dispatch', schedule, command;
    EXECUTE 'SELECT cron.schedule($1, $2, $3)' USING 'pgmb-maintenance', '* * * * *', 'SELECT pgmb.maintenance()';
    RETURN format('pgmb-dispatch: %s  %s', schedule, command);
END $$;

-- Unschedules pgmb's pg_cron jobs (pgmb-dispatch, pgmb-maintenance); returns how many.
CREATE OR REPLACE FUNCTION pgmb.cron_uninstall() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    removed integer := 0;
    job text;
BEGIN
    IF pgmb.cron_version() IS NULL THEN
        RETURN 0;
    END IF;
    FOR job IN EXECUTE 'SELECT jobname FROM cron.job WHERE jobname IN (''pgmb-dispatch'', ''pgmb-maintenance'')' LOOP
        EXECUTE 'SELECT cron.unschedule($1)' USING job;
        removed := removed + 1;
    END LOOP;
    RETURN removed;
END $$;

-- The loop's commit bounds, read from the settings pgmb.indb_commit_every (outcomes, 1 to
-- 10,000) and pgmb.indb_commit_ms (milliseconds, 0 to 60,000): ALTER DATABASE ... SET, or
-- ALTER ROLE, or SET in the calling session. The defaults are here and only here.
CREATE OR REPLACE FUNCTION pgmb.indb_commit_bounds(OUT commit_every integer, OUT commit_ms float8)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    every_setting text := nullif(btrim(current_setting('pgmb.indb_commit_every', true)), '');
    ms_setting text := nullif(btrim(current_setting('pgmb.indb_commit_ms', true)), '');
BEGIN
    commit_every := 50;
    commit_ms := 50;
    -- CASE, not OR: the cast must not be tried on text the pattern refused.
    IF every_setting IS NOT NULL THEN
        IF (CASE WHEN every_setting ~ '^[0-9]{1,9}$' THEN every_setting::integer NOT BETWEEN 1 AND 10000 ELSE true END) THEN
            RAISE EXCEPTION 'invalid pgmb.indb_commit_every %: it must be a whole number of outcomes from 1 to 10000',
                            quote_literal(every_setting)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        commit_every := every_setting::integer;
    END IF;
    IF ms_setting IS NOT NULL THEN
        IF (CASE WHEN ms_setting ~ '^([0-9]{1,9}(\.[0-9]{0,6})?|\.[0-9]{1,6})$' THEN ms_setting::float8 > 60000 ELSE true END) THEN
            RAISE EXCEPTION 'invalid pgmb.indb_commit_ms %: it must be a number of milliseconds from 0 to 60000',
                            quote_literal(ms_setting)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        commit_ms := ms_setting::float8;
    END IF;
END $$;

-- The transport pgmb.post uses: 'http' (the extension, under the default endpoint policy
-- only), 'plpython3u' (the PL/Python transport is installed) or NULL.
CREATE OR REPLACE FUNCTION pgmb.http_transport() RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    transport text;
BEGIN
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'http')
             AND pgmb.endpoint_policy_is_default() THEN 'http'
        WHEN to_regprocedure('pgmb.post_via_plpython(text, text, jsonb, float8)') IS NOT NULL THEN 'plpython3u'
    END INTO transport;
    RETURN transport;
END $$;

-- Writes the outcomes of requests, through pgmb.ack (2xx) and pgmb.fail (the others), in
-- one call each. Should that fail, each outcome is written on its own, so that one that
-- cannot be written does not undo the others; one that cannot is marked started instead
-- (pgmb.start): the request was made, so the expiry of its lease counts as an attempt.
-- Returns how many outcomes were written.
CREATE OR REPLACE FUNCTION pgmb.record_outcomes(delivery_ids bigint[], lease_ids uuid[], outcomes pgmb.http_outcome[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    written integer := 0;
    o pgmb.http_outcome;
BEGIN
    IF cardinality(delivery_ids) IS DISTINCT FROM cardinality(lease_ids)
       OR cardinality(delivery_ids) IS DISTINCT FROM cardinality(outcomes) THEN
        RAISE EXCEPTION 'pgmb.record_outcomes needs one lease id and one outcome per delivery id '
                        '(% delivery ids, % lease ids, % outcomes)',
                        coalesce(cardinality(delivery_ids), 0), coalesce(cardinality(lease_ids), 0),
                        coalesce(cardinality(outcomes), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(delivery_ids) = 0 THEN
        RETURN 0;
    END IF;
    BEGIN
        -- Each function only where it has rows (a call of either costs as much as a few).
        SELECT CASE WHEN a.ids IS NULL THEN 0 ELSE pgmb.ack(a.ids, a.statuses, a.durations) END
               + CASE WHEN f.ids IS NULL THEN 0
                      ELSE pgmb.fail(f.ids, f.leases, f.statuses, f.errors, f.retry_after, f.durations) END
        INTO written
        FROM (SELECT array_agg(u.id) AS ids, array_agg(u.status) AS statuses,
                     array_agg(u.duration_ms) AS durations
              FROM unnest(delivery_ids, outcomes) AS u(id, status, error, retry_after, duration_ms)
              WHERE u.status BETWEEN 200 AND 299) AS a,
             (SELECT array_agg(u.id) AS ids, array_agg(u.lease_id) AS leases,
                     array_agg(u.status) AS statuses, array_agg(u.error) AS errors,
                     array_agg(u.retry_after) AS retry_after, array_agg(u.duration_ms) AS durations
              FROM unnest(delivery_ids, lease_ids, outcomes) AS u(id, lease_id, status, error, retry_after, duration_ms)
              WHERE u.status IS NULL OR u.status NOT BETWEEN 200 AND 299) AS f;
        RETURN written;
    EXCEPTION WHEN others THEN
        RAISE WARNING 'pgmb: could not record % outcomes together (%): recording them one by one',
                      cardinality(delivery_ids), SQLERRM;
    END;
    written := 0;
    FOR i IN 1 .. cardinality(delivery_ids) LOOP
        o := outcomes[i];
        BEGIN
            IF o.status BETWEEN 200 AND 299 THEN
                written := written + pgmb.ack(ARRAY[delivery_ids[i]], ARRAY[o.status], ARRAY[o.duration_ms]);
            ELSE
                written := written + pgmb.fail(ARRAY[delivery_ids[i]], ARRAY[lease_ids[i]], ARRAY[o.status],
                                               ARRAY[o.error], ARRAY[o.retry_after], ARRAY[o.duration_ms]);
            END IF;
        EXCEPTION WHEN others THEN
            -- Not even this outcome could be written: the lease runs out and the delivery is
            -- retried, as after a crash.
            RAISE WARNING 'pgmb: could not record the outcome of delivery %: %', delivery_ids[i], SQLERRM;
            BEGIN
                PERFORM pgmb.start(ARRAY[delivery_ids[i]], ARRAY[lease_ids[i]]);
            EXCEPTION WHEN others THEN
                RAISE WARNING 'pgmb: could not mark delivery % started: %', delivery_ids[i], SQLERRM;
            END;
        END;
    END LOOP;
    RETURN written;
END $$;

-- The headers of one request (pgmb.run_headers of a one-request run).
CREATE OR REPLACE FUNCTION pgmb.request_headers(c pgmb.claimed, unix_time bigint)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (pgmb.run_headers(ARRAY[c], unix_time))[1];
END $$;

-- The steps of pgmb.dispatch_loop, each written once. Each catches its own fault: a step
-- that fails is a warning (or the delivery's outcome), never the loop's end.

-- Step "claim": up to batch deliveries; NULL when none is due or the claim failed (then the
-- loop waits as when none is due, and tries again).
CREATE OR REPLACE FUNCTION pgmb.loop_claim(queue_names text[], batch integer) RETURNS pgmb.claimed[]
LANGUAGE plpgsql AS $$
DECLARE
    claimed pgmb.claimed[];
BEGIN
    SELECT array_agg(x) INTO claimed FROM pgmb.claim(queue_names, batch) AS x;
    RETURN claimed;
EXCEPTION WHEN others THEN
    RAISE WARNING 'pgmb: could not claim: %', SQLERRM;
    RETURN NULL;
END $$;

-- Step "reclaim": hands back the leases that ran out (dispatchers that died), and settles
-- the deliveries whose time to live ran out (pgmb.expire); returns when the next is due.
CREATE OR REPLACE FUNCTION pgmb.loop_reclaim() RETURNS timestamptz
LANGUAGE plpgsql AS $$
BEGIN
    BEGIN
        PERFORM pgmb.reclaim_expired();
    EXCEPTION WHEN others THEN
        RAISE WARNING 'pgmb: could not reclaim expired leases: %', SQLERRM;
    END;
    BEGIN
        PERFORM pgmb.expire();
    EXCEPTION WHEN others THEN
        RAISE WARNING 'pgmb: could not expire deliveries: %', SQLERRM;
    END;
    RETURN clock_timestamp() + pgmb.indb_reclaim_interval();
END $$;

-- Step "heartbeat": the registered dispatcher me (NULL: registering failed, nothing to beat)
-- with in_flight claimed rows not yet posted and its counts; returns when the next is due.
CREATE OR REPLACE FUNCTION pgmb.loop_beat(me bigint, in_flight integer, delivered bigint, failed bigint)
RETURNS timestamptz
LANGUAGE plpgsql AS $$
BEGIN
    IF me IS NOT NULL THEN
        BEGIN
            PERFORM pgmb.dispatcher_beat(me, in_flight, delivered, failed);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'pgmb: could not record a heartbeat: %', SQLERRM;
        END;
    END IF;
    RETURN clock_timestamp() + pgmb.indb_heartbeat_interval();
END $$;

-- Step "record": writes the outcomes kept so far (pgmb.record_outcomes) and empties the
-- three arrays that keep them. A procedure, so that the loop's own arrays are emptied
-- (INOUT) and the loop may COMMIT after it.
CREATE OR REPLACE PROCEDURE pgmb.loop_record(INOUT delivery_ids bigint[], INOUT lease_ids uuid[],
                                             INOUT outcomes pgmb.http_outcome[])
LANGUAGE plpgsql AS $$
BEGIN
    IF cardinality(delivery_ids) > 0 THEN
        -- The history rows written meanwhile are the loop's (pgmb_attempt.indb's default);
        -- set for the call only: what the loop writes otherwise (expired leases) is not.
        PERFORM set_config('pgmb.indb_recording', 'on', true);
        PERFORM pgmb.record_outcomes(delivery_ids, lease_ids, outcomes);
        PERFORM set_config('pgmb.indb_recording', '', true);
    END IF;
    delivery_ids := '{}';
    lease_ids := '{}';
    outcomes := '{}';
END $$;

-- Step "headers": the headers of every claimed row, built in one statement
-- (pgmb.run_headers, as a run builds its own); NULL when one row's cannot be built (a secret
-- stored before the rules refused it, say): then each row builds its own when posted, and
-- the faulty row's fault is its outcome.
CREATE OR REPLACE FUNCTION pgmb.loop_headers(claimed pgmb.claimed[]) RETURNS jsonb[]
LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgmb.run_headers(claimed, extract(epoch FROM now())::bigint);
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

-- Step "post", one request (the http extension's way, or PL/Python's without runs): its
-- outcome. built_headers are the request's headers from the claim's "headers" step (NULL:
-- built here); header_records the same as pgsql-http takes them (pgmb.http_header_records;
-- NULL: made here). transport is the claim's (pgmb.http_transport, looked up once a claim with
-- the endpoint policy that allows the http extension): its post is called directly. A
-- request that cannot be built, or a call that fails rather than give an outcome, is
-- pgmb's own failure (breakers.sql, pgmb.own_failure): the delivery's attempt, never the
-- endpoint's.
CREATE OR REPLACE FUNCTION pgmb.loop_post(c pgmb.claimed, transport text, built_headers jsonb,
                                          header_records text)
RETURNS pgmb.http_outcome
LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz := clock_timestamp();
BEGIN
    IF built_headers IS NULL THEN
        built_headers := pgmb.request_headers(c, extract(epoch FROM now())::bigint);
    END IF;
    -- One statement each, not one CASE: an expression naming pgmb.post_via_plpython cannot
    -- even be planned where PL/Python is missing.
    IF transport = 'plpython3u' THEN
        RETURN pgmb.post_via_plpython(c.endpoint, c.body, built_headers, c.timeout);
    END IF;
    IF transport = 'http' AND header_records IS NOT NULL THEN
        RETURN pgmb.post_via_http_headers(c.endpoint, c.body, header_records, c.timeout);
    END IF;
    IF transport = 'http' THEN
        RETURN pgmb.post_via_http(c.endpoint, c.body, built_headers, c.timeout);
    END IF;
    RETURN pgmb.post(c.endpoint, c.body, built_headers, c.timeout);
EXCEPTION WHEN others THEN
    RETURN ROW(NULL, 'pgmb''s own failure: '
                     || CASE WHEN built_headers IS NULL THEN 'could not build the request: '
                             ELSE 'could not send the request: ' END || SQLERRM, NULL,
               extract(epoch FROM clock_timestamp() - started) * 1000)::pgmb.http_outcome;
END $$;

-- Step "post", a run (PL/Python's pgmb.post_run_via_plpython): row i of claimed and the
-- unpaced rows after it, at most room of them, posted back to back. pgmb.post_run_via_plpython
-- stops earlier at the batch's other bounds: budget_ms for the oldest outcome not yet
-- committed (kept since pending_since; NULL: none is), guess_ms for the next request (the
-- last one's time), and the deadline, or once a request of the run could outlast its lease.
-- The headers are built in one statement; should one row's fail (a secret stored before the
-- rules refused it, say), the rows before it make the run. Returns the rows posted, their
-- outcomes, when the first ended, how long the last took (guess_ms when none was posted) and
-- how many were 2xx; outcomes NULL: not even row i's headers could be built, so it goes the
-- one-request way, which records its fault.
CREATE OR REPLACE FUNCTION pgmb.loop_post_run(
    claimed pgmb.claimed[], i integer, paced boolean, claimed_at timestamptz, room integer,
    budget_ms float8, pending_since timestamptz, guess_ms float8, deadline timestamptz,
    OUT delivery_ids bigint[], OUT lease_ids uuid[], OUT outcomes pgmb.http_outcome[],
    OUT first_finished timestamptz, OUT last_ms float8, OUT ok integer)
LANGUAGE plpgsql AS $$
DECLARE
    unix_time bigint := extract(epoch FROM now())::bigint;
    run_max integer := i - 1 + least(cardinality(claimed) - i + 1, room);
    run_end integer := run_max;
    headers jsonb[];
    urls text[];
    bodies text[];
    timeouts float8[];
    -- The last moment (seconds since the epoch) a request of the run may begin and still
    -- end within its lease.
    lease_end float8;
    started timestamptz;
    posted integer;
BEGIN
    last_ms := guess_ms;
    IF paced THEN
        SELECT coalesce(min(k) - 1, run_max) INTO run_end
        FROM generate_series(i + 1, run_max) AS k
        WHERE (claimed[k]).rps < pgmb.unpaced_rps();
    END IF;
    BEGIN
        headers := pgmb.run_headers(claimed[i:run_end], unix_time);
    EXCEPTION WHEN others THEN
        run_max := run_end;
        run_end := i - 1;
        WHILE run_end < run_max LOOP
            BEGIN
                PERFORM pgmb.request_headers(claimed[run_end + 1], unix_time);
            EXCEPTION WHEN others THEN
                EXIT;
            END;
            run_end := run_end + 1;
        END LOOP;
        IF run_end < i THEN
            RETURN;
        END IF;
        headers := pgmb.run_headers(claimed[i:run_end], unix_time);
    END;
    SELECT array_agg(x.endpoint ORDER BY x.ordinality), array_agg(x.body ORDER BY x.ordinality),
           array_agg(x.timeout ORDER BY x.ordinality), array_agg(x.delivery_id ORDER BY x.ordinality),
           array_agg(x.lease_id ORDER BY x.ordinality),
           min(extract(epoch FROM claimed_at) + x.lease_seconds - x.timeout)
    INTO urls, bodies, timeouts, delivery_ids, lease_ids, lease_end
    FROM unnest(claimed[i:run_end]) WITH ORDINALITY AS x;
    started := clock_timestamp();
    BEGIN
        SELECT array_agg(ROW(r.status, r.error, r.retry_after, r.duration_ms)::pgmb.http_outcome ORDER BY r.n),
               to_timestamp(min(r.finished)), (array_agg(r.duration_ms ORDER BY r.n DESC))[1],
               count(*), count(*) FILTER (WHERE r.status BETWEEN 200 AND 299)
        INTO outcomes, first_finished, last_ms, posted, ok
        FROM pgmb.post_run_via_plpython(
                 urls, bodies, headers, timeouts, room, budget_ms,
                 extract(epoch FROM clock_timestamp() - pending_since) * 1000, guess_ms,
                 -- No window begins past the loop's end, nor once a request of the run could
                 -- outlast its lease (the rest come back to the loop, one by one).
                 least(extract(epoch FROM deadline)::float8, lease_end))
             WITH ORDINALITY AS r(status, error, retry_after, duration_ms, finished, n);
    EXCEPTION WHEN others THEN
        -- Not a request's fault (those are outcomes): the call's. Recorded against the run's
        -- first row; the rest go on in the next run.
        outcomes := ARRAY[ROW(NULL, 'pgmb''s own failure: could not send the request: ' || SQLERRM, NULL,
                              extract(epoch FROM clock_timestamp() - started) * 1000)::pgmb.http_outcome];
        first_finished := clock_timestamp();
        last_ms := extract(epoch FROM clock_timestamp() - started) * 1000;
        posted := 1;
        ok := 0;
    END;
    delivery_ids := delivery_ids[1:posted];
    lease_ids := lease_ids[1:posted];
END $$;

-- The in-database dispatcher: claims, posts and records outcomes for `seconds`, in
-- batches, committing between them (pg_cron runs it as a job, as_job). With the PL/Python
-- transport a batch's requests to one worker go out as runs (pgmb.post_run_via_plpython);
-- with the http extension one at a time. Outcomes are written in batches (pgmb.record_outcomes)
-- within the bounds of pgmb.indb_commit_bounds. Its steps are the pgmb.loop_* routines above,
-- each written once (docs/decisions/0070-the-in-database-loop-in-named-steps.md); what
-- stays here is what runs per request (a call costs there) and the COMMITs, which only a
-- procedure may make. A fault in one request is that delivery's outcome, never the loop's end.
CREATE OR REPLACE PROCEDURE pgmb.dispatch_loop(seconds float8 DEFAULT 55, batch integer DEFAULT pgmb.indb_batch(),
                                    queue_names text[] DEFAULT NULL, as_job boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    commit_every integer;
    commit_ms float8;
    deadline timestamptz := clock_timestamp() + seconds * interval '1 second';
    next_reclaim timestamptz := clock_timestamp();
    -- When to fire schedules next (pgmb.loop_fire_schedules).
    next_fire timestamptz := clock_timestamp();
    me bigint;
    next_beat timestamptz := clock_timestamp() + pgmb.indb_heartbeat_interval();
    delivered bigint := 0;
    failed bigint := 0;
    -- The claim, when it began (its leases run out lease_seconds after, or a little later),
    -- how it is posted, and row i, the next to post.
    claimed pgmb.claimed[];
    claimed_at timestamptz;
    transport text;
    runs boolean;
    -- The claim's headers, row by row (NULL: each row builds its own), and the same as
    -- pgsql-http takes them (the http extension's way).
    claim_headers jsonb[];
    claim_header_records text[];
    -- Whether a run must look for paced rows that end it (most claims have none).
    paced boolean;
    i integer;
    c pgmb.claimed;
    -- Pacing: when each paced worker may next be posted to (seconds since the epoch).
    next_post jsonb := '{}';
    wait float8;
    -- pgmb.start's answer for the row about to be posted (NULL: not asked, or it failed).
    marked integer;
    -- Seconds since the claim began.
    waited float8;
    -- What was just posted (a run, or one request): its rows, their outcomes, how many were
    -- 2xx, when the first ended; when the one request began.
    started timestamptz;
    posted_ok integer;
    posted_ids bigint[];
    posted_leases uuid[];
    posted_outcomes pgmb.http_outcome[];
    first_finished timestamptz;
    -- The outcomes not yet recorded, since when, and how long the last request took (the
    -- guess for the next one).
    done_ids bigint[] := '{}';
    done_leases uuid[] := '{}';
    done_outcomes pgmb.http_outcome[] := '{}';
    pending_since timestamptz;
    last_post_ms float8 := 0;
    -- The session's http.keepalive as the loop found it (NULL or '': not set).
    keepalive_was text := current_setting('http.keepalive', true);
BEGIN
    -- Read first: a bad setting stops the loop before it writes anything.
    SELECT b.commit_every, b.commit_ms INTO commit_every, commit_ms FROM pgmb.indb_commit_bounds() AS b;
    IF pgmb.http_transport() IS NULL THEN
        PERFORM pgmb.no_transport();
    END IF;
    -- pgsql-http keeps its connection between two requests only with http.keepalive on;
    -- otherwise each request connects anew (sending "Connection: close") and its curl
    -- handle is thrown away. On for the loop's session, committed with the first claim;
    -- set whatever the transport, as the http extension may be created while the loop runs
    -- (without it, it is a setting nothing reads). Put back as found when the loop ends
    -- (docs/decisions/0075-the-http-extensions-path-kept-alive.md).
    PERFORM set_config('http.keepalive', 'on', false);
    -- Registered for the operator (pgmb.dispatchers); committed with the first claim.
    BEGIN
        me := pgmb.dispatcher_start('in_database', coalesce(host(inet_server_addr()), 'local'),
                                    pg_backend_pid(), queue_names);
    EXCEPTION WHEN others THEN
        RAISE WARNING 'pgmb: could not register the dispatcher: %', SQLERRM;
    END;
    WHILE clock_timestamp() < deadline LOOP
        EXIT WHEN as_job AND NOT pgmb.cron_job_scheduled();
        IF clock_timestamp() >= next_beat THEN
            next_beat := pgmb.loop_beat(me, 0, delivered, failed);
        END IF;
        IF clock_timestamp() >= next_reclaim THEN
            next_reclaim := pgmb.loop_reclaim();
        END IF;
        -- Schedules due: published in this turn's transaction, committed with its claim.
        IF clock_timestamp() >= next_fire THEN
            next_fire := pgmb.loop_fire_schedules();
        END IF;
        claimed_at := clock_timestamp();
        claimed := pgmb.loop_claim(queue_names, batch);
        IF claimed IS NULL THEN
            -- Nothing waits for a sleep: the outcomes kept so far are committed first.
            CALL pgmb.loop_record(done_ids, done_leases, done_outcomes);
            COMMIT;
            wait := least(coalesce(pgmb.next_wakeup(queue_names), 1), 1,
                          extract(epoch FROM deadline - clock_timestamp()),
                          extract(epoch FROM next_fire - clock_timestamp()));
            COMMIT;
            PERFORM pg_sleep(greatest(wait, 0.005));
            CONTINUE;
        END IF;
        -- Once per claim: an http extension created or dropped meanwhile is seen at the next.
        -- Runs need pgmb.post_run_via_plpython, which a database given PL/Python by hand may
        -- lack: then one request at a time.
        transport := pgmb.http_transport();
        runs := transport = 'plpython3u'
                AND to_regprocedure('pgmb.post_run_via_plpython(text[], text[], jsonb[], float8[], integer, '
                                    'float8, float8, float8, float8)') IS NOT NULL;
        SELECT coalesce(bool_or(x.rps < pgmb.unpaced_rps()), false) INTO paced FROM unnest(claimed) AS x;
        -- One request at a time: the headers of the whole claim in one statement (a run
        -- builds its own).
        claim_headers := CASE WHEN NOT runs THEN pgmb.loop_headers(claimed) END;
        claim_header_records := CASE WHEN transport = 'http' THEN pgmb.http_header_records(claim_headers) END;
        i := 1;
        WHILE i <= cardinality(claimed) LOOP
            c := claimed[i];
            IF clock_timestamp() >= deadline THEN
                -- Out of time: hand back what was not posted, unattempted.
                PERFORM pgmb.release(ARRAY(SELECT x.delivery_id FROM unnest(claimed[i:]) AS x),
                                     ARRAY(SELECT x.lease_id FROM unnest(claimed[i:]) AS x));
                EXIT;
            END IF;
            -- Pacing: requests to one worker at least 1/rps apart (the bucket caps the rest).
            wait := 0;
            IF c.rps < pgmb.unpaced_rps() AND next_post ? c.worker_id::text THEN
                wait := (next_post ->> c.worker_id::text)::float8 - extract(epoch FROM clock_timestamp());
            END IF;
            -- A COMMIT before this request: the claim's (the first of a claim), before and
            -- after a pacing wait (nothing waits for a sleep), or the batch's, once it is
            -- full or its oldest outcome would wait too long. This request's start mark
            -- goes with it.
            marked := NULL;
            IF i = 1 OR wait > 0
               OR cardinality(done_ids) >= commit_every
               OR (cardinality(done_ids) > 0
                   AND extract(epoch FROM clock_timestamp() - pending_since) * 1000 + last_post_ms >= commit_ms) THEN
                CALL pgmb.loop_record(done_ids, done_leases, done_outcomes);
                IF wait > 0 THEN
                    COMMIT;
                    PERFORM pg_sleep(wait);
                END IF;
                -- A failed mark does not hold the request back: its expiry would then be
                -- forgiven (up to twice), as after a crash within a batch.
                BEGIN
                    marked := pgmb.start(ARRAY[c.delivery_id], ARRAY[c.lease_id]);
                EXCEPTION WHEN others THEN
                    RAISE WARNING 'pgmb: could not mark delivery % started: %', c.delivery_id, SQLERRM;
                END;
                COMMIT;
            END IF;
            -- A request ends within its lease (docs/decisions/0040-a-request-ends-within-its-lease.md):
            -- posted only if it can end before its lease runs out, reckoned from before the
            -- claim, as pgmb_dispatch does (where a lease stored before that rule is not
            -- longer than the timeout, a request that waited under a quarter of it goes). A
            -- later one is handed back unattempted, with the outcomes kept so far, so that no
            -- other dispatcher posts it while this one does. A start mark refused (0: the
            -- lease is no longer this claim's, reclaimed after it ran out) is not posted either.
            -- In seconds, not intervals: a timeout or lease stored before the rules may be
            -- past what an interval holds.
            waited := extract(epoch FROM clock_timestamp() - claimed_at);
            IF marked = 0
               OR (waited + c.timeout >= c.lease_seconds
                   AND (c.lease_seconds > c.timeout OR waited > c.lease_seconds / 4)) THEN
                CALL pgmb.loop_record(done_ids, done_leases, done_outcomes);
                IF marked IS DISTINCT FROM 0 THEN
                    PERFORM pgmb.release(ARRAY[c.delivery_id], ARRAY[c.lease_id]);
                END IF;
                COMMIT;
                i := i + 1;
                CONTINUE;
            END IF;
            -- Post: a run from this row, or this one request.
            posted_outcomes := NULL;
            IF runs AND c.rps >= pgmb.unpaced_rps() THEN
                SELECT r.delivery_ids, r.lease_ids, r.outcomes, r.first_finished, r.last_ms, r.ok
                INTO posted_ids, posted_leases, posted_outcomes, first_finished, last_post_ms, posted_ok
                FROM pgmb.loop_post_run(claimed, i, paced, claimed_at, commit_every - cardinality(done_ids),
                                        commit_ms, CASE WHEN cardinality(done_ids) > 0 THEN pending_since END,
                                        last_post_ms, deadline) AS r;
            END IF;
            IF posted_outcomes IS NULL THEN
                IF c.rps < pgmb.unpaced_rps() THEN
                    next_post := next_post || jsonb_build_object(c.worker_id::text,
                                                                 extract(epoch FROM clock_timestamp()) + 1.0 / c.rps);
                END IF;
                started := clock_timestamp();
                -- A paced row builds its headers when posted: its signature's time is then
                -- its request's, however long it waited.
                posted_outcomes := ARRAY[CASE WHEN c.rps >= pgmb.unpaced_rps()
                                              THEN pgmb.loop_post(c, transport, claim_headers[i], claim_header_records[i])
                                              ELSE pgmb.loop_post(c, transport, NULL, NULL) END];
                first_finished := clock_timestamp();
                last_post_ms := extract(epoch FROM first_finished - started) * 1000;
                posted_ok := CASE WHEN (posted_outcomes[1]).status BETWEEN 200 AND 299 THEN 1 ELSE 0 END;
                posted_ids := ARRAY[c.delivery_id];
                posted_leases := ARRAY[c.lease_id];
            END IF;
            -- Keep the outcomes for the next "record".
            IF cardinality(done_ids) = 0 THEN
                pending_since := first_finished;
            END IF;
            done_ids := done_ids || posted_ids;
            done_leases := done_leases || posted_leases;
            done_outcomes := done_outcomes || posted_outcomes;
            delivered := delivered + posted_ok;
            failed := failed + cardinality(posted_outcomes) - posted_ok;
            i := i + cardinality(posted_outcomes);
            IF clock_timestamp() >= next_beat THEN
                next_beat := pgmb.loop_beat(me, cardinality(claimed) - i + 1, delivered, failed);
            END IF;
        END LOOP;
    END LOOP;
    -- The last outcomes, committed with the CALL.
    CALL pgmb.loop_record(done_ids, done_leases, done_outcomes);
    IF me IS NOT NULL THEN
        BEGIN
            PERFORM pgmb.dispatcher_stop(me, delivered, failed);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'pgmb: could not mark the dispatcher stopped: %', SQLERRM;
        END;
    END IF;
    -- RESET, not '': pgsql-http keeps connections whenever the setting has any value.
    IF coalesce(keepalive_was, '') = '' THEN
        RESET http.keepalive;
    ELSE
        PERFORM set_config('http.keepalive', keepalive_was, false);
    END IF;
END $$;

-- A routing key with a character pgmb.routing_key_header does not keep, percent-encoded.
CREATE OR REPLACE FUNCTION pgmb.routing_key_escaped(routing_key text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT string_agg(CASE WHEN ch ~ '^[\x21-\x24\x26-\x7e]$' THEN ch
                           ELSE upper(regexp_replace(encode(convert_to(ch, 'UTF8'), 'hex'),
                                                     '(..)', '%\1', 'g')) END,
                      '' ORDER BY n)
    FROM regexp_split_to_table(routing_key, '') WITH ORDINALITY AS t(ch, n)
$$;

-- The value of the pgmb-routing-key header of a routing key, as
-- pgmb.worker_request.routing_key_header gives it: printable ASCII but '%' as it is, every
-- other character as the percent-encoded bytes of its UTF-8 (RFC 3986, upper-case hex), so
-- that the header is ASCII on every path and a worker gets the key back with any URL-unquote.
-- Most keys are all kept: one match, no copy. One expression without a subquery and not
-- STRICT (a NULL key is NULL through pgmb.routing_key_escaped), so that the planner inlines
-- it into the statement that builds a claim's headers: a call of a SQL function it cannot
-- inline cost about 17 µs a request, the inlined match about 1.
CREATE OR REPLACE FUNCTION pgmb.routing_key_header(routing_key text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN routing_key ~ '^[\x21-\x24\x26-\x7e]*$' THEN routing_key
                ELSE pgmb.routing_key_escaped(routing_key) END
$$;

-- The headers of each request of a run, as pgmb/worker_request.py builds them: the
-- message's own headers (printable ASCII values of valid names, none reserved: the
-- names the transports set themselves, User-Agent included, are dropped whatever their case),
-- pgmb's, and a Standard Webhooks signature per signing secret (c.secrets). The header rule's
-- one SQL home.
CREATE OR REPLACE FUNCTION pgmb.run_headers(requests pgmb.claimed[], unix_time bigint)
RETURNS jsonb[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    built jsonb[];
BEGIN
    SELECT array_agg(
               coalesce((
                   SELECT jsonb_object_agg(e.key, v.value)
                   FROM jsonb_each(coalesce(c.headers, '{}')) AS e
                   CROSS JOIN LATERAL (SELECT CASE WHEN jsonb_typeof(e.value) = 'string'
                                                   THEN e.value #>> '{}' ELSE e.value::text END AS value) AS v
                   WHERE NOT pgmb.reserved_header(e.key)
                     AND e.key ~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]{1,128}$'
                     AND v.value ~ '^[\x20-\x7e]*$'), '{}')
            || jsonb_build_object(
                   'Content-Type', 'application/json',
                   'pgmb-message-id', c.message_id::text,
                   'pgmb-routing-key', pgmb.routing_key_header(c.routing_key),
                   'pgmb-queue', c.queue,
                   'pgmb-attempt', c.attempt::text)
            -- One "v1,<signature>" per secret, space-separated, in the order given (current
            -- first): a receiver holding any of them verifies (rotation).
            || CASE WHEN coalesce(cardinality(c.secrets), 0) = 0 THEN '{}'::jsonb ELSE jsonb_build_object(
                   'webhook-id', c.message_id::text,
                   'webhook-timestamp', unix_time::text,
                   'webhook-signature', (
                       SELECT string_agg('v1,' || encode(pgmb.hmac_sha256(
                                  pgmb.secret_key(s.secret),
                                  convert_to(c.message_id::text || '.' || unix_time || '.' || c.body, 'UTF8')), 'base64'),
                              ' ' ORDER BY s.n)
                       FROM unnest(c.secrets) WITH ORDINALITY AS s(secret, n)))
               END
            ORDER BY c.ordinality)
    INTO built
    FROM unnest(requests) WITH ORDINALITY AS c;
    RETURN built;
END $$;
