-- In-database dispatch (the seed's design): a procedure that claims, POSTs through the
-- `http` extension (pgsql-http) or PL/Python, and records each outcome with a COMMIT of its
-- own; pg_cron runs it. Same claim/ack/fail functions and rate limits as pgmb_dispatch.

-- What one POST produced. status NULL: no HTTP answer (error says why).
DO $$ BEGIN
    CREATE TYPE pgmb.http_outcome AS (status integer, error text, retry_after float8, duration_ms float8);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

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

-- The headers of one POST, as pgmb/dispatch/request.py builds them: the message's own
-- headers (printable ASCII values of valid names, none reserved), pgmb's, and a Standard
-- Webhooks signature when the worker has a secret.
CREATE OR REPLACE FUNCTION pgmb.request_headers(c pgmb.claimed, unix_time bigint) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce((
               SELECT jsonb_object_agg(e.key, v.value)
               FROM jsonb_each(coalesce(c.headers, '{}')) AS e
               CROSS JOIN LATERAL (SELECT CASE WHEN jsonb_typeof(e.value) = 'string'
                                               THEN e.value #>> '{}' ELSE e.value::text END AS value) AS v
               WHERE lower(e.key) NOT IN ('host', 'content-type', 'content-length', 'connection',
                                          'transfer-encoding', 'expect', 'upgrade', 'te', 'trailer',
                                          'keep-alive', 'proxy-connection')
                 AND lower(e.key) NOT LIKE 'pgmb-%' AND lower(e.key) NOT LIKE 'webhook-%'
                 AND e.key ~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]{1,128}$'
                 AND v.value ~ '^[\x20-\x7e]*$'), '{}')
        || jsonb_build_object(
               'Content-Type', 'application/json',
               'pgmb-message-id', c.message_id::text,
               'pgmb-routing-key', c.routing_key,
               'pgmb-queue', c.queue,
               'pgmb-attempt', c.attempt::text)
        || CASE WHEN coalesce(c.secret, '') = '' THEN '{}'::jsonb ELSE jsonb_build_object(
               'webhook-id', c.message_id::text,
               'webhook-timestamp', unix_time::text,
               'webhook-signature', 'v1,' || encode(pgmb.hmac_sha256(
                   CASE WHEN c.secret LIKE 'whsec\_%' THEN decode(substr(c.secret, 7), 'base64')
                        ELSE convert_to(c.secret, 'UTF8') END,
                   convert_to(c.message_id::text || '.' || unix_time || '.' || c.body, 'UTF8')), 'base64'))
           END
$$;

-- Seconds to wait from a Retry-After value (delta-seconds or an HTTP date).
CREATE OR REPLACE FUNCTION pgmb.retry_after_seconds(value text) RETURNS float8
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF value ~ '^\s*\d+\s*$' THEN
        RETURN trim(value)::float8;
    END IF;
    RETURN greatest(0, extract(epoch FROM value::timestamptz - now()));
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

-- The outcome of an HTTP answer, as pgmb/dispatch/client.py classifies it.
CREATE OR REPLACE FUNCTION pgmb.http_outcome(status integer, content text, location text, retry_after text,
                                             started timestamptz, body_limit integer DEFAULT 500)
RETURNS pgmb.http_outcome
LANGUAGE sql STABLE AS $$
    SELECT ROW(status,
               CASE WHEN status BETWEEN 200 AND 299 THEN ''
                    ELSE trim(format('HTTP %s%s: %s', status,
                                     CASE WHEN status BETWEEN 300 AND 399
                                          THEN format(' redirect to %s (not followed)', coalesce(location, '?')) ELSE '' END,
                                     left(coalesce(content, ''), body_limit))) END,
               CASE WHEN status IN (429, 503) THEN pgmb.retry_after_seconds(retry_after) END,
               extract(epoch FROM clock_timestamp() - started) * 1000)::pgmb.http_outcome
$$;

-- POST through pgsql-http. Called through EXECUTE so that this file installs without it.
-- pgsql-http follows redirects itself (up to 5) and has no option to stop it.
CREATE OR REPLACE FUNCTION pgmb.post_via_http(url text, body text, headers jsonb, timeout float8)
RETURNS pgmb.http_outcome
LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz := clock_timestamp();
    status integer;
    content text;
    location text;
    retry_after text;
BEGIN
    EXECUTE 'SELECT http_set_curlopt(''CURLOPT_TIMEOUT_MS'', $1)' USING ceil(timeout * 1000)::bigint::text;
    EXECUTE $q$
        SELECT (r).status, (r).content,
               (SELECT h.value FROM unnest((r).headers) AS h WHERE lower(h.field) = 'location' LIMIT 1),
               (SELECT h.value FROM unnest((r).headers) AS h WHERE lower(h.field) = 'retry-after' LIMIT 1)
        FROM (SELECT http(('POST', $1,
                           (SELECT coalesce(array_agg(http_header(k, v)), '{}')
                            FROM jsonb_each_text($2) AS e(k, v) WHERE lower(k) <> 'content-type'),
                           'application/json', $3)::http_request) AS r) AS response
    $q$ INTO status, content, location, retry_after USING url, headers, body;
    RETURN pgmb.http_outcome(status, content, location, retry_after, started);
EXCEPTION WHEN others THEN
    RETURN ROW(NULL, 'HTTP request failed: ' || SQLERRM, NULL,
               extract(epoch FROM clock_timestamp() - started) * 1000)::pgmb.http_outcome;
END $$;

-- Which transport the in-database path uses here: 'http', 'plpython3u' or NULL (none).
CREATE OR REPLACE FUNCTION pgmb.http_transport() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'http') THEN 'http'
        WHEN to_regprocedure('pgmb.post_via_plpython(text, text, jsonb, float8)') IS NOT NULL THEN 'plpython3u'
    END
$$;

CREATE OR REPLACE FUNCTION pgmb.post(url text, body text, headers jsonb, timeout float8)
RETURNS pgmb.http_outcome
LANGUAGE plpgsql AS $$
BEGIN
    CASE pgmb.http_transport()
        WHEN 'http' THEN RETURN pgmb.post_via_http(url, body, headers, timeout);
        WHEN 'plpython3u' THEN
            RETURN pgmb.post_via_plpython(url, body, headers, timeout);
        ELSE
            RAISE EXCEPTION 'pgmb: no HTTP transport in this database'
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Install the http extension (pgsql-http) or plpython3u, or run manage.py pgmb_dispatch instead.';
    END CASE;
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

-- Dispatch for `seconds`: claim a batch (COMMIT), POST each delivery and record its outcome
-- (COMMIT after each), so no row lock is held across a request and one failure never undoes
-- another's ack. Run by pg_cron; also CALLable by hand. Must be CALLed outside a transaction.
-- As a pg_cron job (as_job), it also stops as soon as its job is unscheduled.
CREATE OR REPLACE PROCEDURE pgmb.dispatch_loop(seconds float8 DEFAULT 55, batch integer DEFAULT 50,
                                               queue_names text[] DEFAULT NULL, burst float8 DEFAULT 0.2,
                                               as_job boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + seconds * interval '1 second';
    next_reclaim timestamptz := clock_timestamp();
    claimed pgmb.claimed[];
    c pgmb.claimed;
    outcome pgmb.http_outcome;
    next_post jsonb := '{}';
    wait float8;
BEGIN
    IF pgmb.http_transport() IS NULL THEN
        RAISE EXCEPTION 'pgmb: no HTTP transport in this database' USING ERRCODE = 'feature_not_supported';
    END IF;
    WHILE clock_timestamp() < deadline LOOP
        EXIT WHEN as_job AND NOT pgmb.cron_job_scheduled();
        IF clock_timestamp() >= next_reclaim THEN
            PERFORM pgmb.reclaim_expired();
            next_reclaim := clock_timestamp() + interval '5 seconds';
        END IF;
        SELECT array_agg(x) INTO claimed FROM pgmb.claim(queue_names, batch, burst) AS x;
        COMMIT;
        IF claimed IS NULL THEN
            wait := least(coalesce(pgmb.next_wakeup(queue_names), 1), 1,
                          extract(epoch FROM deadline - clock_timestamp()));
            COMMIT;
            PERFORM pg_sleep(greatest(wait, 0.005));
            CONTINUE;
        END IF;
        FOR i IN 1 .. cardinality(claimed) LOOP
            c := claimed[i];
            IF clock_timestamp() >= deadline THEN
                -- Out of time: hand back what was not posted, unattempted.
                PERFORM pgmb.release(ARRAY(SELECT x.delivery_id FROM unnest(claimed[i:]) AS x),
                                     ARRAY(SELECT x.lease_id FROM unnest(claimed[i:]) AS x));
                COMMIT;
                RETURN;
            END IF;
            -- Pacing: requests to one worker at least 1/rps apart (the bucket caps the rest).
            IF c.rps < 1000 AND next_post ? c.worker_id::text THEN
                wait := (next_post ->> c.worker_id::text)::float8 - extract(epoch FROM clock_timestamp());
                IF wait > 0 THEN PERFORM pg_sleep(wait); END IF;
            END IF;
            next_post := next_post || jsonb_build_object(c.worker_id::text,
                                                         extract(epoch FROM clock_timestamp()) + 1.0 / c.rps);
            outcome := pgmb.post(c.endpoint, c.body,
                                 pgmb.request_headers(c, extract(epoch FROM now())::bigint), c.timeout);
            IF outcome.status BETWEEN 200 AND 299 THEN
                PERFORM pgmb.ack(ARRAY[c.delivery_id], ARRAY[outcome.status], ARRAY[outcome.duration_ms]);
            ELSE
                PERFORM pgmb.fail(ARRAY[c.delivery_id], ARRAY[c.lease_id], ARRAY[outcome.status],
                                  ARRAY[outcome.error], ARRAY[outcome.retry_after], ARRAY[outcome.duration_ms]);
            END IF;
            COMMIT;
        END LOOP;
    END LOOP;
END $$;

-- Housekeeping for the pg_cron path: expired leases, and pg_cron's own run log.
CREATE OR REPLACE FUNCTION pgmb.maintenance(keep interval DEFAULT '1 day') RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    reclaimed integer := pgmb.reclaim_expired(10000);
BEGIN
    IF to_regclass('cron.job_run_details') IS NOT NULL THEN
        EXECUTE 'DELETE FROM cron.job_run_details WHERE end_time < now() - $1' USING keep;
    END IF;
    RETURN reclaimed;
END $$;

-- pg_cron's version here as an array (e.g. {1,4}), NULL if pg_cron is not in this database.
CREATE OR REPLACE FUNCTION pgmb.cron_version() RETURNS integer[]
LANGUAGE sql STABLE AS $$
    SELECT string_to_array(substring(extversion FROM '^[0-9.]+'), '.')::integer[]
    FROM pg_extension WHERE extname = 'pg_cron'
$$;

-- Schedule (or re-schedule) pgmb's jobs. pg_cron >= 1.5 runs a short loop every second;
-- 1.4 (Debian 12) has only minutes, so a per-minute job loops for 55 s.
CREATE OR REPLACE FUNCTION pgmb.cron_install(batch integer DEFAULT 50) RETURNS text
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
