-- Migration 0003_release_0_2_0 (pgmb 0.2.0): what changed in pgmb/sql/schema/ since 0.1.1,
-- written by hand, by concern. Every object here is also in pgmb/sql/schema/, which stays
-- the source to read; tests/migrations proves both build the same catalog. 0.1.1's
-- dispatchers keep running while this applies: a function they call keeps its arguments
-- and result (a changed one gets a new name beside it; CONTRIBUTING.md, Migrations).
-- A function that several concerns changed is created once, as this release leaves it, in
-- the section of the first concern that changed it (pgmb.claim under "A cap on requests in
-- flight" holds the fair pick and the expiry's skip too).

-- ==== Pull: history when asked, reads and deletes ====

-- Only a pull queue may keep no history (the column is Django's AddField, before this).
ALTER TABLE pgmb_queue
    ADD CONSTRAINT pgmb_queue_history_pull_only CHECK (keep_history OR worker_id IS NULL);

-- pgmb.create, and whether the queue keeps its history (pgmb_queue.keep_history, on by
-- default): off, a pull queue's pgmb.delete and pgmb.pop write no 'ack' row
-- (docs/decisions/0063-pull-queues-without-history.md). Only a pull queue may turn it off.
CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, max_retries integer, worker_id uuid,
                                       keep_history boolean)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    new_id uuid;
BEGIN
    PERFORM pgmb.check_name('queue', $1);
    PERFORM pgmb.compile_binding($2);
    IF worker_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pgmb_worker w WHERE w.id = worker_id) THEN
        RAISE EXCEPTION 'unknown worker id %', worker_id
            USING ERRCODE = 'foreign_key_violation',
                  HINT = 'Register the worker first: SELECT pgmb.worker(name, endpoint, rps); or pass NULL for a pull queue.';
    END IF;
    PERFORM pgmb.check_keep_history($1, $4, $5);
    INSERT INTO pgmb_queue (name, binding_key, pattern, worker_id, max_retries, keep_history)
    VALUES ($1, $2, '', $4, $3, $5)  -- "create" is a keyword, so no create.name
    RETURNING id INTO new_id;
    RETURN new_id;
END $$;

-- Turns a queue's history on or off (see pgmb.create above); returns the setting as it was.
-- Takes effect for the deletes that start after it commits.
CREATE OR REPLACE FUNCTION pgmb.set_keep_history(queue_name text, keep_history boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    worker uuid;
    was boolean;
BEGIN
    SELECT q.worker_id, q.keep_history INTO worker, was FROM pgmb_queue q WHERE q.name = queue_name
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue % does not exist', quote_literal(queue_name) USING ERRCODE = 'undefined_object';
    END IF;
    PERFORM pgmb.check_keep_history(queue_name, worker, keep_history);
    UPDATE pgmb_queue q SET keep_history = set_keep_history.keep_history
    WHERE q.name = queue_name AND q.keep_history IS DISTINCT FROM set_keep_history.keep_history;
    RETURN was;
END $$;

-- The rule of the constraint pgmb_queue_history_pull_only, with its own message.
CREATE OR REPLACE FUNCTION pgmb.check_keep_history(queue_name text, worker_id uuid, keep_history boolean)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF keep_history IS NULL THEN
        RAISE EXCEPTION 'invalid keep_history NULL for queue %: it must be true or false', quote_literal(queue_name)
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT keep_history AND worker_id IS NOT NULL THEN
        RAISE EXCEPTION 'queue % has a worker: only a pull queue may keep no history', quote_literal(queue_name)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A push queue''s history is what its delivered counts, replay and the worker''s health read.';
    END IF;
END $$;

-- Creates a queue; the documented argument order: (name, binding_key, max_retries,
-- worker_id). worker_id NULL makes a pull queue; an unknown worker id is an error.
-- Returns the queue's id. It keeps its history (the five-argument pgmb.create above).
CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, max_retries integer, worker_id uuid)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT pgmb.create(name, binding_key, max_retries, worker_id, true) $$;

-- Settles read deliveries of one pull queue: deleted from the hot table, one history row
-- each with outcome ('ack' or 'archived'). Returns the ids settled. Ids of another queue
-- are an error; as it is raised after the delete, the delete is undone with the statement,
-- and the common case pays no second look-up. A queue that keeps no history (its
-- keep_history off) writes no 'ack' row: its delete only deletes, as PGMQ's does; an
-- archive is always recorded, as it is the only trace of an archived message
-- (docs/decisions/0063-pull-queues-without-history.md).
CREATE OR REPLACE FUNCTION pgmb.settle_reads(queue_name text, delivery_ids bigint[], outcome text)
RETURNS SETOF bigint LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
AS $$
DECLARE
    q record;
    done integer;
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    -- The ids go straight to the caller (RETURN QUERY), as pgmb.read's rows do.
    IF outcome = 'ack' AND NOT (SELECT qu.keep_history FROM pgmb_queue qu WHERE qu.id = q.id) THEN
        RETURN QUERY
        DELETE FROM pgmb_delivery d
        WHERE d.id = ANY (delivery_ids) AND d.queue_id = q.id
        RETURNING d.id;
    ELSE
        RETURN QUERY
        WITH gone AS (
            DELETE FROM pgmb_delivery d
            WHERE d.id = ANY (delivery_ids) AND d.queue_id = q.id
            RETURNING d.id, d.message_id, d.queue_id, d.attempts
        ), history AS (
            INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
            SELECT g.message_id, g.queue_id, g.attempts, settle_reads.outcome, NULL, NULL, '', clock_timestamp()
            FROM gone g
        )
        SELECT g.id FROM gone g;
    END IF;
    GET DIAGNOSTICS done = ROW_COUNT;
    IF delivery_ids IS NULL OR done < cardinality(delivery_ids) THEN
        PERFORM pgmb.check_pull_ids(queue_name, q.id, delivery_ids);
    END IF;
END $$;

-- Closed, as every function of pgmb's but the reviewed list (access.sql).
REVOKE EXECUTE ON FUNCTION pgmb.create(text, text, integer, uuid, boolean),
    pgmb.set_keep_history(text, boolean), pgmb.check_keep_history(text, uuid, boolean) FROM PUBLIC;

-- ==== Pull: reads and deletes, design B ====

CREATE OR REPLACE FUNCTION pgmb.read(queue_name text, vt double precision, qty integer, filter jsonb DEFAULT NULL::jsonb) RETURNS SETOF pgmb.pull_message
LANGUAGE plpgsql AS $$
DECLARE
    -- First, before any expression a planted operator could match (tables.sql).
    closed boolean := pgmb.refuse_writable_schemas();
    q record;
    t timestamptz := clock_timestamp();
    -- Visible: due at or before upto (t, then see the end of the loop).
    upto timestamptz := t;
    body_filter jsonb := filter -> 'body';
    headers_filter jsonb := filter -> 'headers';
    remaining integer := qty;
    got integer;
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    PERFORM pgmb.check_pull_args(vt, qty, filter);
    IF q.paused THEN
        RETURN;
    END IF;
    LOOP
        -- One ordered scan of the queue's part of pgmb_delivery_due, as a push claim's. A
        -- delivery read 1 + max_retries times already is dead-lettered instead, in the same
        -- statement, as pgmb.settle_failures does with push failures; the statement then
        -- sets pgmb.read_buried (for this transaction), which the caller cannot see in its
        -- rows.
        RETURN QUERY
        WITH picked AS (
            -- A first read cannot be the last one: only a delivery read before looks up its
            -- message's own max_retries.
            SELECT d.id, d.available_at AS was, lim.max_retries,
                   d.attempts >= 1 + coalesce(lim.max_retries, 0) AND lim.max_retries IS NOT NULL AS exhausted
            FROM pgmb_delivery d
            CROSS JOIN LATERAL (
                SELECT CASE WHEN d.attempts = 0 THEN NULL
                            ELSE coalesce((SELECT m.max_retries FROM pgmb_message m WHERE m.id = d.message_id),
                                          q.max_retries) END AS max_retries
            ) AS lim
            WHERE d.queue_id = q.id AND d.state = 'ready' AND d.available_at <= upto
              AND (d.expires_at IS NULL OR d.expires_at > t)  -- expired: pgmb.expire's
              AND (filter IS NULL
                   OR EXISTS (SELECT 1 FROM pgmb_message m
                              WHERE m.id = d.message_id
                                AND (body_filter IS NULL OR m.body @> body_filter)
                                AND (headers_filter IS NULL OR m.headers @> headers_filter)))
            ORDER BY d.priority, d.available_at, d.id
            LIMIT remaining
            FOR UPDATE OF d SKIP LOCKED
        ), dead AS (
            DELETE FROM pgmb_delivery d
            WHERE d.id = ANY (ARRAY(SELECT p.id FROM picked p WHERE p.exhausted))
            RETURNING d.message_id, d.queue_id, d.attempts, d.last_status,
                      format('read %s times and never deleted (max_retries %s): dead-lettered instead of read again',
                             d.attempts, (SELECT p.max_retries FROM picked p WHERE p.id = d.id)) AS error,
                      set_config('pgmb.read_buried', 'yes', true) AS buried
        ), dead_letters AS (
            INSERT INTO pgmb_dead_letter (message_id, queue_id, attempts, last_status, last_error, created_at)
            SELECT x.message_id, x.queue_id, x.attempts, x.last_status, x.error, clock_timestamp()
            FROM dead x
            ON CONFLICT (message_id, queue_id) DO UPDATE
            SET attempts = excluded.attempts, last_status = excluded.last_status,
                last_error = excluded.last_error, created_at = excluded.created_at
            -- Each dead letter announced (pgmb.dead_lettered, events.sql).
            RETURNING pgmb.dead_letter_event(message_id, queue_id, attempts, last_status, last_error)
        ), history AS (
            INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
            SELECT x.message_id, x.queue_id, x.attempts, 'dead', NULL, NULL, x.error, clock_timestamp()
            FROM dead x WHERE x.buried IS NOT NULL
        ), r AS (
            UPDATE pgmb_delivery d
            SET attempts = d.attempts + 1, available_at = t + make_interval(secs => vt)
            WHERE d.id = ANY (ARRAY(SELECT p.id FROM picked p WHERE NOT p.exhausted))
            RETURNING d.id, d.message_id, d.attempts, d.created_at, d.available_at, d.priority
        )
        SELECT r.id, r.message_id, r.attempts, r.created_at, r.available_at,
               m.body, m.headers, m.routing_key::text
        FROM r JOIN picked p ON p.id = r.id JOIN pgmb_message m ON m.id = r.message_id
        ORDER BY r.priority, p.was, r.id;
        GET DIAGNOSTICS got = ROW_COUNT;
        remaining := remaining - got;
        -- Only dead-lettered rows make room for more in the same read (rare: a full read,
        -- the common case, never looks).
        EXIT WHEN remaining <= 0 OR current_setting('pgmb.read_buried', true) IS DISTINCT FROM 'yes';
        PERFORM set_config('pgmb.read_buried', '', true);
        -- The rows just read are due at t + vt: with a timeout that rounds to nothing they
        -- are due at t, and must not be read twice.
        IF t + make_interval(secs => vt) <= t THEN
            upto := t - interval '1 microsecond';
        END IF;
    END LOOP;
END $$;

-- pgmb.read acts for its caller and keeps its planner settings (both are the function's
-- own, which CREATE OR REPLACE resets; pull.sql).
SELECT pgmb.pin_definers(ARRAY['pgmb.read(text, double precision, integer, jsonb)']);
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off;

-- ==== Tasks: a task enqueued by one function call ====

-- A task's message and its READY result, for pgmb.tasks.backend.PgmbBackend.enqueue: the
-- message as pgmb.publish.send writes it (the route_messages trigger delivers it at the
-- end of its INSERT; its headers: the enqueuer's trace context, or {}), the result with
-- the same id. Only when some queue is bound to the key, by the routing rule of
-- pgmb.admit_message and the trigger (the binding's tags, then its pattern); otherwise
-- nothing is written and the result is NULL, the caller's transaction still usable
-- (nothing was raised in it). Returns the result's enqueued_at.
-- A function rather than one statement sent as text: PL/pgSQL plans its statements once a
-- session, where the statement's text was planned at every call and the key's tags
-- computed there by running pgmb.key_tags, not inlined
-- (docs/decisions/0067-a-task-enqueued-by-one-function-call.md).
CREATE OR REPLACE FUNCTION pgmb.enqueue_task(
    id uuid, routing_key text, body jsonb, message_priority integer, backend text,
    task_path text, queue_name text, priority integer, run_after timestamptz, args jsonb,
    kwargs jsonb, headers jsonb
) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz;
BEGIN
    IF NOT EXISTS (SELECT FROM pgmb_queue AS q
                   WHERE q.binding_tags <@ pgmb.key_tags(enqueue_task.routing_key)
                     AND ('.' || enqueue_task.routing_key) ~ q.pattern) THEN
        RETURN NULL;
    END IF;
    INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at, priority)
    VALUES (enqueue_task.id, enqueue_task.routing_key, enqueue_task.body, enqueue_task.headers, now(),
            greatest(now(), coalesce(enqueue_task.run_after, now())),
            enqueue_task.message_priority);
    INSERT INTO pgmb_task_result AS r
        (id, backend, task_path, queue_name, priority, run_after, args, kwargs, status,
         enqueued_at, errors, worker_ids)
    VALUES (enqueue_task.id, enqueue_task.backend, enqueue_task.task_path,
            enqueue_task.queue_name, enqueue_task.priority, enqueue_task.run_after,
            enqueue_task.args, enqueue_task.kwargs, 'READY', statement_timestamp(), '[]', '{}')
    RETURNING r.enqueued_at INTO at;
    RETURN at;
END $$;

-- Its generic plan from the first call: a custom plan would compute the key's tags by
-- running pgmb.key_tags at planning, as the statement sent as text did.
ALTER FUNCTION pgmb.enqueue_task(uuid, text, jsonb, integer, text, text, text, integer,
                                 timestamptz, jsonb, jsonb, jsonb)
    SET plan_cache_mode = force_generic_plan;

-- Closed, as every function of pgmb's but the reviewed list (access.sql).
REVOKE EXECUTE ON FUNCTION pgmb.enqueue_task(uuid, text, jsonb, integer, text, text, text,
                                             integer, timestamptz, jsonb, jsonb, jsonb) FROM PUBLIC;

-- ==== In-database loop: named steps and the http extension's path ====

-- pgmb.dispatch_loop in named steps, its constants named once
-- (docs/decisions/0070-the-in-database-loop-in-named-steps.md), and the http extension's
-- path made cheaper per request (docs/decisions/0072-the-http-extensions-path-per-request.md,
-- docs/decisions/0075-the-http-extensions-path-kept-alive.md): the claim's headers built
-- once, a request one PL/pgSQL expression, the transport's post called directly, the
-- connection kept alive. Each object is created here once, as pgmb/sql/schema/indb.sql has
-- it. The signature of pgmb.dispatch_loop and the arguments and results of
-- pgmb.post_via_http, pgmb.http_outcome and pgmb.routing_key_header are 0.1.1's: the
-- pg_cron job 0.1.1 scheduled calls the loop unchanged, and a loop running while this
-- applies goes on with the code it started with.

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

-- Closed, as every function of pgmb's but the reviewed list (access.sql).
REVOKE EXECUTE ON FUNCTION
    pgmb.unpaced_rps(),
    pgmb.indb_heartbeat_interval(),
    pgmb.indb_reclaim_interval(),
    pgmb.indb_batch(),
    pgmb.loop_claim(text[], integer),
    pgmb.loop_reclaim(),
    pgmb.loop_beat(bigint, integer, bigint, bigint),
    pgmb.loop_headers(pgmb.claimed[]),
    pgmb.loop_post(pgmb.claimed, text, jsonb, text),
    pgmb.http_header_records(jsonb[]),
    pgmb.post_via_http_headers(text, text, text, float8),
    pgmb.routing_key_escaped(text),
    pgmb.loop_post_run(pgmb.claimed[], integer, boolean, timestamptz, integer, float8, timestamptz, float8, timestamptz)
FROM PUBLIC;
REVOKE EXECUTE ON PROCEDURE pgmb.loop_record(bigint[], uuid[], pgmb.http_outcome[]) FROM PUBLIC;

-- ==== Claims: one plan a session ====

-- The statements of the claim and of the outcomes have one plan whatever the statistics
-- say (their other scans and sorts are off): kept for the session instead of planned at
-- every call (deliveries.sql).
ALTER FUNCTION pgmb.claim(text[], integer) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgmb.start(bigint[], uuid[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgmb.ack(bigint[], integer[], double precision[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgmb.settle_failures(bigint[], uuid[], integer[], text[], double precision[], double precision[], text)
    SET plan_cache_mode = force_generic_plan;

-- PL/pgSQL, so that its query is planned once a session, not at every claim (routing.sql).
CREATE OR REPLACE FUNCTION pgmb.signing_secrets(current text, worker_id uuid, at timestamptz)
RETURNS text[]
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN array_remove(ARRAY[current], '') || ARRAY(
        SELECT s.secret::text FROM pgmb_worker_secret s
        WHERE s.worker_id = signing_secrets.worker_id AND s.expires_at > at
        ORDER BY s.retired_at DESC, s.id DESC
        LIMIT pgmb.max_retiring_secrets());
END $$;

-- ==== Publishing: indexes that earn their place ====
-- The routing trigger's plan follows pgmb_queue's statistics (tables.sql,
-- docs/decisions/0073-publishing-write-path.md): analyzed by autovacuum after any change,
-- and now, so that a few queues are scanned, not looked up through the GIN index. Every
-- index of pgmb_message and pgmb_delivery stays (the decision says what each costs and
-- which read it serves). The routing trigger itself is reinstalled by the Django
-- operations of 0003_release_0_2_0.py (pgmb/trigger_guard.py).
ALTER TABLE pgmb_queue SET (autovacuum_analyze_threshold = 0, autovacuum_analyze_scale_factor = 0);
ANALYZE pgmb_queue;

-- ==== History partitioned by time ====

-- History partitioned by time (docs/decisions/0076-history-partitioned-by-message-day.md):
-- pgmb_message is partitioned by RANGE (id) and pgmb_attempt by RANGE (message_id), one
-- partition a UTC day of the message id's time (a UUID v7's first 48 bits), so that a
-- message's attempts live in its day and retention drops a day's two tables instead of
-- deleting its rows. Each table's DEFAULT partition takes every id no day holds: ids that
-- producers gave (any UUID), a clock past the days made and, in a database upgraded from
-- 0.1.x, every row stored before (the old table became the default partition). Nothing is
-- refused for want of a partition.

-- The id that starts a UTC day: its first 48 bits that day's first millisecond, the rest
-- zero. Day partitions are bounded by these.
CREATE OR REPLACE FUNCTION pgmb.day_floor(day date) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT encode(substring(int8send((extract(epoch FROM day::timestamp) * 1000)::bigint) FROM 3)
                  || '\x00000000000000000000'::bytea, 'hex')::uuid
$$;

-- The history tables and the column each is partitioned by.
CREATE OR REPLACE FUNCTION pgmb.history_tables() RETURNS TABLE (parent name, key name)
LANGUAGE sql IMMUTABLE
AS $$ VALUES ('pgmb_message'::name, 'id'::name), ('pgmb_attempt'::name, 'message_id'::name) $$;

-- Gives table `dst` the grants table `src` has (its owner's aside): a partition gets its
-- parent's, as pgmb.apply_access gives every pgmb_* table.
CREATE OR REPLACE FUNCTION pgmb.copy_table_grants(src regclass, dst regclass) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    i record;
BEGIN
    FOR i IN SELECT a.privilege_type, a.grantee FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = src AND a.grantee <> c.relowner LOOP
        EXECUTE format('GRANT %s ON %s TO %s', i.privilege_type, dst,
                       CASE WHEN i.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(i.grantee::regrole::text) END);
    END LOOP;
END $$;

-- Turns one of the history tables into a partitioned table, in constant time whatever it
-- holds: the table is renamed <table>_default (its indexes and statistics after it), a
-- partitioned table with its columns, defaults, checks, indexes, statistics, triggers and
-- grants is made under its name, and the old table attached as its DEFAULT partition (a
-- default partition is attached without a scan while it is the only one). The views over
-- it and the functions of its row type are made again for the new table. Does nothing if
-- the table is partitioned already.
CREATE OR REPLACE FUNCTION pgmb.partition_history_table(tbl name, key name) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    old regclass := tbl::regclass;
    part name := tbl || '_default';
    schema name := (SELECT relnamespace::regnamespace::name FROM pg_class WHERE oid = old);
    views text[];
    triggers text[];
    statistics text[];
    i record;
    g record;
    def text;
    seq_name name;
    seq_acl aclitem[];
    seq_owner name;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = old) = 'p' THEN
        RETURN;
    END IF;
    -- Printed before the rename, so that they name the table, not its old relation.
    views := ARRAY(SELECT DISTINCT format('CREATE OR REPLACE VIEW %s AS %s', v.oid::regclass,
                                          pg_get_viewdef(v.oid))
                   FROM pg_depend d JOIN pg_rewrite w ON w.oid = d.objid
                   JOIN pg_class v ON v.oid = w.ev_class
                   WHERE d.refobjid = old AND d.classid = 'pg_rewrite'::regclass AND v.oid <> old);
    triggers := ARRAY(SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t
                      WHERE t.tgrelid = old AND NOT t.tgisinternal ORDER BY t.tgname);
    statistics := ARRAY(SELECT pg_get_statisticsobjdef(s.oid) FROM pg_statistic_ext s WHERE s.stxrelid = old);
    FOR i IN SELECT s.stxnamespace::regnamespace::name AS nsp, s.stxname FROM pg_statistic_ext s
             WHERE s.stxrelid = old LOOP
        EXECUTE format('DROP STATISTICS %I.%I', i.nsp, i.stxname);
    END LOOP;
    FOR i IN SELECT t.tgname FROM pg_trigger t WHERE t.tgrelid = old AND NOT t.tgisinternal LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', i.tgname, old);
    END LOOP;

    EXECUTE format('ALTER TABLE %s RENAME TO %I', old, part);
    FOR i IN SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
             WHERE x.indrelid = old LOOP
        EXECUTE format('ALTER INDEX %I.%I RENAME TO %I', schema, i.relname,
                       part || substring(i.relname FROM length(tbl) + 1));
    END LOOP;
    EXECUTE format('CREATE TABLE %I.%I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS'
                   ' INCLUDING STORAGE INCLUDING COMMENTS) PARTITION BY RANGE (%I)',
                   schema, tbl, old, key);
    -- An identity column becomes a column of the parent drawing from a sequence of the
    -- same name, options, state, grants and owner (PostgreSQL 17 and later refuse to attach
    -- a table with an identity column as a partition; before 17 a partitioned table's
    -- identity is not its partitions'): rows go in through the parent, whose default counts.
    FOR i IN SELECT a.attname, pg_get_serial_sequence(old::text, a.attname)::regclass AS seq,
                    format_type(a.atttypid, a.atttypmod) AS kind
             FROM pg_attribute a WHERE a.attrelid = old AND a.attidentity <> '' LOOP
        SELECT c.relname, c.relacl, c.relowner::regrole::name INTO seq_name, seq_acl, seq_owner
        FROM pg_class c WHERE c.oid = i.seq;
        SELECT format('AS %s INCREMENT %s MINVALUE %s MAXVALUE %s START %s CACHE %s %s', i.kind,
                      q.seqincrement, q.seqmin, q.seqmax, q.seqstart, q.seqcache,
                      CASE WHEN q.seqcycle THEN 'CYCLE' ELSE 'NO CYCLE' END)
            INTO def FROM pg_sequence q WHERE q.seqrelid = i.seq;
        EXECUTE format('CREATE SEQUENCE %I.%I %s', schema, seq_name || '_new', def);
        EXECUTE format('SELECT setval(%L, last_value, is_called) FROM %s',
                       format('%I.%I', schema, seq_name || '_new'), i.seq);
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP IDENTITY', old, i.attname);
        EXECUTE format('ALTER SEQUENCE %I.%I RENAME TO %I', schema, seq_name || '_new', seq_name);
        EXECUTE format('ALTER SEQUENCE %I.%I OWNER TO %I', schema, seq_name, seq_owner);
        FOR g IN SELECT a.privilege_type, a.grantee FROM aclexplode(seq_acl) a
                 WHERE a.grantee <> (SELECT relowner FROM pg_class WHERE oid = old) LOOP
            EXECUTE format('GRANT %s ON SEQUENCE %I.%I TO %s', g.privilege_type, schema, seq_name,
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END);
        END LOOP;
        EXECUTE format('ALTER TABLE %I.%I ALTER COLUMN %I SET DEFAULT nextval(%L::regclass)', schema, tbl,
                       i.attname, format('%I.%I', schema, seq_name));
        EXECUTE format('ALTER SEQUENCE %I.%I OWNED BY %I.%I.%I', schema, seq_name, schema, tbl, i.attname);
    END LOOP;
    -- The primary key where it holds the partition key (the message's id); the attempt's
    -- id stays unique in each partition and, drawn from one sequence, in all.
    FOR i IN SELECT x.indexrelid, pg_get_constraintdef(c.oid) AS def FROM pg_index x
             JOIN pg_constraint c ON c.conindid = x.indexrelid AND c.contype = 'p'
             WHERE x.indrelid = old AND (SELECT attnum FROM pg_attribute WHERE attrelid = old AND attname = key)
                                        = ANY (x.indkey::int2[]) LOOP
        EXECUTE format('ALTER TABLE %I.%I ADD CONSTRAINT %I %s', schema, tbl, tbl || '_pkey', i.def);
    END LOOP;
    FOR i IN SELECT c.relname, pg_get_indexdef(x.indexrelid) AS def FROM pg_index x
             JOIN pg_class c ON c.oid = x.indexrelid
             WHERE x.indrelid = old AND NOT x.indisprimary LOOP
        def := regexp_replace(i.def, '^CREATE (UNIQUE )?INDEX \S+ ON \S+ ',
                              format('CREATE \1INDEX %I ON %I.%I ', tbl || substring(i.relname FROM length(part) + 1),
                                     schema, tbl));
        EXECUTE def;
    END LOOP;
    EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %s DEFAULT', schema, tbl, old);
    EXECUTE format('ALTER TABLE %I.%I OWNER TO %I', schema, tbl,
                   (SELECT relowner::regrole::name FROM pg_class WHERE oid = old));
    PERFORM pgmb.copy_table_grants(old, format('%I.%I', schema, tbl)::regclass);
    FOREACH def IN ARRAY statistics LOOP
        EXECUTE def;
    END LOOP;
    FOREACH def IN ARRAY triggers LOOP
        EXECUTE def;
    END LOOP;
    FOREACH def IN ARRAY views LOOP
        EXECUTE def;
    END LOOP;
    -- A function of the old row type now takes the default partition's: made again for
    -- the table's, with the old one's grants, and the old one dropped.
    FOR i IN SELECT p.oid, p.proname, p.pronamespace, p.proacl FROM pg_proc p
             WHERE (SELECT reltype FROM pg_class WHERE oid = old) = ANY (p.proargtypes::oid[]) LOOP
        def := pg_get_functiondef(i.oid);
        EXECUTE format('DROP FUNCTION %s', i.oid::regprocedure);
        EXECUTE replace(def, part, tbl);
        SELECT p.oid INTO i.oid FROM pg_proc p
        WHERE p.proname = i.proname AND p.pronamespace = i.pronamespace
          AND (SELECT reltype FROM pg_class WHERE relname = tbl AND relnamespace = schema::regnamespace)
              = ANY (p.proargtypes::oid[]);
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', i.oid::regprocedure);
        FOR g IN SELECT a.grantee FROM aclexplode(i.proacl) a
                 WHERE a.grantee <> (SELECT proowner FROM pg_proc WHERE oid = i.oid) LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', i.oid::regprocedure,
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END);
        END LOOP;
    END LOOP;
END $$;

-- Ids from this day on go to each table's far partition (<table>_far): a producer's UUID
-- v4 mostly falls there (its first 48 bits are random, and 98.5 % of their values lie past
-- this day's), which keeps such ids out of the default partition. pgmb's own ids reach it
-- in the year 2100, and go on being stored there.
CREATE OR REPLACE FUNCTION pgmb.history_far_day() RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT date '2100-01-01' $$;

-- Making partitions reads the default partition once under its ACCESS EXCLUSIVE lock (a
-- new partition's range must be proven absent from it), and every statement that reaches
-- the default (claims' generic plans lock every partition) waits meanwhile: about 0.6 s
-- a million rows on the machine of docs/benchmarks.md. Days are made automatically only
-- while each default partition holds at most this many rows by its statistics; above it,
-- by an operator who passes a higher limit (manage.py pgmb_history premake --scan-limit).
CREATE OR REPLACE FUNCTION pgmb.history_scan_limit() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 1000000::bigint $$;

-- The day partitions there are: each table's, its day and bounds, oldest first.
CREATE OR REPLACE FUNCTION pgmb.history_days()
RETURNS TABLE (parent name, partition name, day date, low uuid, high uuid)
LANGUAGE sql STABLE
AS $$
    SELECT h.parent, c.relname, to_date(right(c.relname, 8), 'YYYYMMDD'),
           pgmb.day_floor(to_date(right(c.relname, 8), 'YYYYMMDD')),
           pgmb.day_floor(to_date(right(c.relname, 8), 'YYYYMMDD') + 1)
    FROM pgmb.history_tables() h
    JOIN pg_inherits i ON i.inhparent = h.parent::regclass
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE c.relname ~ '_p[0-9]{8}$'
    ORDER BY 3, 1
$$;

-- The rows a default partition holds by its statistics (by its size, at 100 bytes a row,
-- before it was ever analyzed).
CREATE OR REPLACE FUNCTION pgmb.estimated_rows(tbl regclass) RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint ELSE pg_relation_size(c.oid) / 100 END
    FROM pg_class c WHERE c.oid = tbl
$$;

-- How many rows of [low, high) table `tbl` holds (high NULL: no end), counting at most
-- `most` + 1: read by its index on `key`.
CREATE OR REPLACE FUNCTION pgmb.rows_between(tbl regclass, key name, low uuid, high uuid, most bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    found bigint;
BEGIN
    EXECUTE format('SELECT count(*) FROM (SELECT FROM %s WHERE %I >= $1 AND ($2 IS NULL OR %I < $2) LIMIT $3) AS r',
                   tbl, key, key)
        INTO found USING low, high, most + 1;
    RETURN found;
END $$;

-- Makes the partitions of the UTC days from `first` to `last` and the far partitions, of
-- both history tables, that do not exist yet; returns how many tables it made. Rows of
-- their ranges already in the default partition (ids that producers gave, or a day that
-- began before its partition was made) move into them, unless a range has more than
-- 10,000: moving them would hold the locks as long, so that range is left out (its rows,
-- and new ones, stay in the default partition). Does nothing, and says so in a NOTICE,
-- while a default partition holds more than `scan_limit` rows (NULL: no limit), or while
-- its locks are not had within a second (the next run tries again): publishing and claims
-- never wait longer for it. Both tables' partitions are made in one transaction: a
-- message's attempts go where it goes.
CREATE OR REPLACE FUNCTION pgmb.make_history_days(first date, last date,
                                                  scan_limit bigint DEFAULT pgmb.history_scan_limit())
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    h record;
    parents name[];
    parts name[];
    lows uuid[];
    highs uuid[];
    over text;
    crowded text[];
    most_moved CONSTANT bigint := 10000;
    lock_wait text := current_setting('lock_timeout');
    checks text[];
    made integer := 0;
BEGIN
    IF first IS NULL OR last IS NULL THEN
        RAISE EXCEPTION 'invalid days % to %: both must be given', first, last
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(t.parent), array_agg(n.partition), array_agg(n.low), array_agg(n.high)
        INTO parents, parts, lows, highs
    FROM pgmb.history_tables() t,
         LATERAL (SELECT format('%s_p%s', t.parent, to_char(g, 'YYYYMMDD')) AS partition,
                         pgmb.day_floor(g::date) AS low, pgmb.day_floor(g::date + 1) AS high
                  FROM generate_series(first, least(last, pgmb.history_far_day() - 1), interval '1 day') AS g
                  UNION ALL
                  SELECT t.parent || '_far', pgmb.day_floor(pgmb.history_far_day()), NULL) AS n
    WHERE to_regclass(quote_ident(n.partition)) IS NULL;
    IF parts IS NULL THEN
        RETURN 0;
    END IF;
    SELECT string_agg(format('%s holds about %s rows', t.parent || '_default',
                             pgmb.estimated_rows((t.parent || '_default')::regclass)), ', ')
        INTO over
    FROM pgmb.history_tables() t
    WHERE pgmb.estimated_rows((t.parent || '_default')::regclass) > scan_limit;
    IF over IS NOT NULL THEN
        RAISE NOTICE 'pgmb: history partitions not made: % (the limit is %: a higher one holds its lock longer)',
            over, scan_limit;
        RETURN 0;
    END IF;
    -- Every lock first, parents before their default partitions (the order a publish
    -- takes them in); a wait past a second gives up rather than queue publishers behind it.
    PERFORM set_config('lock_timeout', '1s', true);
    BEGIN
        FOR h IN SELECT * FROM pgmb.history_tables() LOOP
            EXECUTE format('LOCK TABLE ONLY %I IN SHARE UPDATE EXCLUSIVE MODE', h.parent);
        END LOOP;
        FOR h IN SELECT * FROM pgmb.history_tables() LOOP
            EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', h.parent || '_default');
        END LOOP;
    EXCEPTION WHEN lock_not_available THEN
        PERFORM set_config('lock_timeout', lock_wait, true);
        RAISE NOTICE 'pgmb: history partitions not made: their tables were busy (the next run tries again)';
        RETURN 0;
    END;
    PERFORM set_config('lock_timeout', lock_wait, true);
    -- Ranges left out for both tables alike, by their names' suffix (_pYYYYMMDD, _far).
    crowded := ARRAY(SELECT substring(n.partition FROM length(n.parent) + 1)
                     FROM unnest(parents, parts, lows, highs) AS n(parent, partition, low, high)
                     JOIN pgmb.history_tables() t ON t.parent = n.parent
                     WHERE pgmb.rows_between((n.parent || '_default')::regclass, t.key, n.low, n.high,
                                             most_moved) > most_moved);
    IF cardinality(crowded) > 0 THEN
        RAISE NOTICE 'pgmb: history partitions not made: %, whose rows the default partition already holds more than % of',
            array_to_string(crowded, ', '), most_moved;
        SELECT array_agg(n.parent ORDER BY n.i), array_agg(n.partition ORDER BY n.i),
               array_agg(n.low ORDER BY n.i), array_agg(n.high ORDER BY n.i)
            INTO parents, parts, lows, highs
        FROM unnest(parents, parts, lows, highs) WITH ORDINALITY AS n(parent, partition, low, high, i)
        WHERE substring(n.partition FROM length(n.parent) + 1) <> ALL (crowded);
        IF parts IS NULL THEN
            RETURN 0;
        END IF;
    END IF;
    FOR h IN SELECT * FROM pgmb.history_tables() LOOP
        checks := '{}';
        FOR i IN 1 .. cardinality(parts) LOOP
            CONTINUE WHEN parents[i] <> h.parent;
            EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)',
                           parts[i], h.parent);
            PERFORM pgmb.copy_table_grants(h.parent::regclass, parts[i]::regclass);
            -- Found by the default partition's index: few rows, if any.
            EXECUTE format('WITH moved AS (DELETE FROM %I WHERE %I >= $1 AND ($2 IS NULL OR %I < $2) RETURNING *)'
                           ' INSERT INTO %I SELECT * FROM moved',
                           h.parent || '_default', h.key, h.key, parts[i])
                USING lows[i], highs[i];
            checks := checks || format('ADD CONSTRAINT %I CHECK (%s)', parts[i] || '_new',
                                       CASE WHEN highs[i] IS NULL THEN format('%I < %L', h.key, lows[i])
                                            ELSE format('%I < %L OR %I >= %L', h.key, lows[i], h.key, highs[i]) END);
        END LOOP;
        CONTINUE WHEN cardinality(checks) = 0;
        -- One read of the default partition proves every new range absent from it (one
        -- ALTER TABLE checks all its constraints in one scan): the ATTACHes read nothing.
        EXECUTE format('ALTER TABLE %I %s', h.parent || '_default', array_to_string(checks, ', '));
        FOR i IN 1 .. cardinality(parts) LOOP
            CONTINUE WHEN parents[i] <> h.parent;
            EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%s)',
                           h.parent, parts[i], lows[i], coalesce(quote_literal(highs[i]), 'MAXVALUE'));
            EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', h.parent || '_default', parts[i] || '_new');
            made := made + 1;
        END LOOP;
    END LOOP;
    RETURN made;
END $$;

-- Makes the partitions of today and the `days` days after it (UTC), and the far
-- partitions, that do not exist yet (pgmb.make_history_days); returns how many tables it
-- made. `days` is PGMB['HISTORY_PREMAKE_DAYS'] (pgmb.conf) when Python calls it, this
-- default otherwise (pgmb.maintenance, pg_cron; tests/python compares the two).
CREATE OR REPLACE FUNCTION pgmb.premake_history(days integer DEFAULT 3,
                                                scan_limit bigint DEFAULT pgmb.history_scan_limit())
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
BEGIN
    IF days IS NULL OR days < 0 THEN
        RAISE EXCEPTION 'invalid days %: it must be 0 or more', days USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN pgmb.make_history_days(today, today + days, scan_limit);
END $$;

-- Retention: the day partitions whose day ended before now() - older_than, oldest
-- first. A day with no unfinished message (a live delivery or a dead letter) is dropped,
-- both its tables; a day with some is emptied of the rest (TRUNCATE) and keeps those
-- messages and their attempts, and is dropped by a later run once they are finished.
-- The default partition is never touched: its rows leave as the archive job deletes
-- them. Returns each day retired, the messages and attempts it removed (counted only if
-- `count_rows`: a count reads the day's tables, which dropping them does not), and the
-- messages kept.
CREATE OR REPLACE FUNCTION pgmb.retire_history(older_than interval, count_rows boolean DEFAULT false)
RETURNS TABLE (day date, messages bigint, attempts bigint, kept bigint)
LANGUAGE plpgsql AS $$
DECLARE
    d record;
    keep uuid[];
    message_part name;
    attempt_part name;
    kept_attempts bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '0' THEN
        RAISE EXCEPTION 'invalid age %: it must be 0 or more', older_than USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR d IN SELECT DISTINCT h.day, h.low, h.high FROM pgmb.history_days() h
             WHERE (h.day + 1)::timestamp AT TIME ZONE 'UTC' <= now() - older_than
             ORDER BY h.day LOOP
        message_part := format('pgmb_message_p%s', to_char(d.day, 'YYYYMMDD'));
        attempt_part := format('pgmb_attempt_p%s', to_char(d.day, 'YYYYMMDD'));
        keep := ARRAY(SELECT x.message_id FROM pgmb_delivery x WHERE x.message_id >= d.low AND x.message_id < d.high
                      UNION
                      SELECT x.message_id FROM pgmb_dead_letter x WHERE x.message_id >= d.low AND x.message_id < d.high);
        day := d.day;
        kept := cardinality(keep);
        messages := NULL;
        attempts := NULL;
        IF count_rows THEN
            EXECUTE format('SELECT count(*) FROM %I', message_part) INTO messages;
            EXECUTE format('SELECT count(*) FROM %I', attempt_part) INTO attempts;
        END IF;
        IF kept = 0 THEN
            EXECUTE format('DROP TABLE %I, %I', message_part, attempt_part);
        ELSE
            -- The kept rows go back into their own day's tables, as they were: not through
            -- the parent, whose triggers would route and check them again.
            CREATE TEMP TABLE pgmb_kept_messages ON COMMIT DROP AS SELECT * FROM pgmb_message WHERE false;
            CREATE TEMP TABLE pgmb_kept_attempts ON COMMIT DROP AS SELECT * FROM pgmb_attempt WHERE false;
            EXECUTE format('INSERT INTO pgmb_kept_messages SELECT * FROM %I WHERE id = ANY ($1)', message_part) USING keep;
            EXECUTE format('INSERT INTO pgmb_kept_attempts SELECT * FROM %I WHERE message_id = ANY ($1)', attempt_part)
                USING keep;
            GET DIAGNOSTICS kept_attempts = ROW_COUNT;
            messages := messages - kept;
            attempts := attempts - kept_attempts;
            EXECUTE format('TRUNCATE %I, %I', message_part, attempt_part);
            EXECUTE format('ALTER TABLE %I DISABLE TRIGGER USER', message_part);
            EXECUTE format('INSERT INTO %I SELECT * FROM pgmb_kept_messages', message_part);
            EXECUTE format('ALTER TABLE %I ENABLE TRIGGER USER', message_part);
            EXECUTE format('INSERT INTO %I SELECT * FROM pgmb_kept_attempts', attempt_part);
            DROP TABLE pgmb_kept_messages, pgmb_kept_attempts;
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

SELECT pgmb.partition_history_table(h.parent, h.key) FROM pgmb.history_tables() h;
-- The first days, while the migration's locks are held, only where the old tables are
-- small (pgmb.make_history_days reads the default partition once: 0.6 s a million rows on
-- the machine of docs/benchmarks.md). A bigger database gets its days from housekeeping
-- once the archive job has brought its old rows under pgmb.history_scan_limit(), or
-- from an operator (manage.py pgmb_history premake --scan-limit), and publishes into
-- the old table until then.
SELECT pgmb.premake_history(3, 100000);

-- pgmb.duplicated for a stored message (the routing trigger's call): its producer read back.
-- PL/pgSQL, so that it is not inlined into the routing trigger's statement, whose plan
-- would then read and lock each of pgmb_message's partitions (one a day of history,
-- history.sql) at every publish; only a message with a dedup id runs it.
CREATE OR REPLACE FUNCTION pgmb.duplicated(dedup_window float8, pattern text, message_id uuid,
                                           dedup_id text, created_at timestamptz)
RETURNS SETOF uuid
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT pgmb.duplicated(dedup_window, pattern, message_id, dedup_id, created_at,
                           (SELECT m.producer FROM pgmb_message m WHERE m.id = duplicated.message_id));
END $$;

-- A dispatcher found nothing to claim and is about to wait: mark it waiting. True once no
-- message insert is in flight, after which every publisher sees the mark; false if one
-- is (the caller claims again shortly and calls this again before it sleeps for long).
CREATE OR REPLACE FUNCTION pgmb.dispatcher_idle(dispatcher_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pgmb_dispatcher d SET waiting = true WHERE d.id = dispatcher_id AND d.waiting IS NOT true;
    BEGIN
        -- The parent only: every publish takes it, and its partitions would each cost a lock.
        LOCK TABLE ONLY pgmb_message IN SHARE MODE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    RETURN true;
END $$;

-- Housekeeping for the pg_cron path: expired leases, expired deliveries (pgmb.expire),
-- pg_cron's own run log, the rows
-- of dispatchers stopped or gone for longer than `keep`, expired retiring secrets, and
-- the history's days ahead (pgmb.premake_history, history.sql).
CREATE OR REPLACE FUNCTION pgmb.maintenance(keep interval DEFAULT '1 day') RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    reclaimed integer := pgmb.reclaim_expired(10000);
BEGIN
    IF to_regclass('cron.job_run_details') IS NOT NULL THEN
        EXECUTE 'DELETE FROM cron.job_run_details WHERE end_time < now() - $1' USING keep;
    END IF;
    DELETE FROM pgmb_dispatcher d
    WHERE coalesce(d.stopped_at, d.heartbeat_at) < now() - keep
      AND pgmb.dispatcher_state(d.heartbeat_at, d.stopped_at) <> 'running';
    PERFORM pgmb.expire(10000);
    PERFORM pgmb.forget_expired_secrets();
    PERFORM pgmb.premake_history();
    RETURN reclaimed;
END $$;

-- Closed, as every function of pgmb's but the reviewed list (access.sql).
REVOKE EXECUTE ON FUNCTION
    pgmb.day_floor(date),
    pgmb.copy_table_grants(regclass, regclass),
    pgmb.history_tables(),
    pgmb.partition_history_table(name, name),
    pgmb.history_days(),
    pgmb.history_far_day(),
    pgmb.history_scan_limit(),
    pgmb.estimated_rows(regclass),
    pgmb.rows_between(regclass, name, uuid, uuid, bigint),
    pgmb.make_history_days(date, date, bigint),
    pgmb.premake_history(integer, bigint),
    pgmb.retire_history(interval, boolean)
FROM PUBLIC;

-- ==== Archive by day ====

-- The archive job takes a day whole (pgmb/pipeline/archive.py,
-- docs/decisions/0079-the-archive-takes-whole-days.md): day `day`'s two partitions,
-- whose day ended before `cutoff`, are detached from pgmb_message and pgmb_attempt and
-- renamed pgmb_archive_<run>_message_<YYYYMMDD> and pgmb_archive_<run>_attempt_<YYYYMMDD>,
-- which run `run` then reads whole and drops once its Parquet is committed. The messages
-- the archive keeps (the rule of its row by row claims, archive.sql: a live delivery, a
-- dead letter, published or last attempted at or after the cutoff) move with their
-- attempts into the default partitions first, where they go on as before. The day is
-- recorded in pgmb_archive_day. One short transaction, whose locks (the parents' ACCESS
-- EXCLUSIVE: every publish, claim and settle waits meanwhile) are had within a second or
-- not at all: then nothing is done and NULL returned (the next run tries again). Returns
-- the messages kept.
CREATE OR REPLACE FUNCTION pgmb.claim_history_day(run bigint, day date, cutoff timestamptz)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    low uuid := pgmb.day_floor(day);
    high uuid := pgmb.day_floor(day + 1);
    message_part name := format('pgmb_message_p%s', to_char(day, 'YYYYMMDD'));
    attempt_part name := format('pgmb_attempt_p%s', to_char(day, 'YYYYMMDD'));
    message_table name := format('pgmb_archive_%s_message_%s', run, to_char(day, 'YYYYMMDD'));
    attempt_table name := format('pgmb_archive_%s_attempt_%s', run, to_char(day, 'YYYYMMDD'));
    message_default CONSTANT name := 'pgmb_message_default';
    attempt_default CONSTANT name := 'pgmb_attempt_default';
    lock_wait text := current_setting('lock_timeout');
    keep uuid[];
BEGIN
    IF run IS NULL OR day IS NULL OR cutoff IS NULL OR (day + 1)::timestamp AT TIME ZONE 'UTC' > cutoff THEN
        RAISE EXCEPTION 'invalid day % for cutoff %: the day must end before it', day, cutoff
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The claim lock first, as the row by row claims take it (a pgmb.replay in progress
    -- commits its deliveries first), then the parents before their partitions (the order
    -- a publish takes them in).
    PERFORM set_config('lock_timeout', '1s', true);
    BEGIN
        PERFORM pg_advisory_xact_lock(pgmb.archive_lock_key('claim'));
        LOCK TABLE ONLY pgmb_message, pgmb_attempt IN ACCESS EXCLUSIVE MODE;
        IF to_regclass(quote_ident(message_part)) IS NULL OR to_regclass(quote_ident(attempt_part)) IS NULL THEN
            PERFORM set_config('lock_timeout', lock_wait, true);
            RETURN NULL;
        END IF;
        EXECUTE format('LOCK TABLE %I, %I, %I, %I IN ACCESS EXCLUSIVE MODE',
                       message_part, attempt_part, message_default, attempt_default);
    EXCEPTION WHEN lock_not_available THEN
        PERFORM set_config('lock_timeout', lock_wait, true);
        RETURN NULL;
    END;
    PERFORM set_config('lock_timeout', lock_wait, true);
    -- The deliveries and dead letters by their message index, the day's late rows by the
    -- created_at indexes: a few rows whatever the day's size.
    EXECUTE format('SELECT ARRAY(SELECT x.message_id FROM pgmb_delivery x WHERE x.message_id >= $1 AND x.message_id < $2'
                   ' UNION SELECT x.message_id FROM pgmb_dead_letter x WHERE x.message_id >= $1 AND x.message_id < $2'
                   ' UNION SELECT m.id FROM %I m WHERE m.created_at >= $3'
                   ' UNION SELECT a.message_id FROM %I a WHERE a.created_at >= $3)',
                   message_part, attempt_part)
        INTO keep USING low, high, cutoff;
    EXECUTE format('ALTER TABLE pgmb_message DETACH PARTITION %I', message_part);
    EXECUTE format('ALTER TABLE pgmb_attempt DETACH PARTITION %I', attempt_part);
    EXECUTE format('ALTER TABLE %I RENAME TO %I', message_part, message_table);
    EXECUTE format('ALTER TABLE %I RENAME TO %I', attempt_part, attempt_table);
    IF cardinality(keep) > 0 THEN
        -- Straight into the default partitions, which now hold the day's range: not
        -- through the parents, whose triggers would route and check them again.
        EXECUTE format('ALTER TABLE %I DISABLE TRIGGER USER', message_default);
        EXECUTE format('WITH moved AS (DELETE FROM %I WHERE id = ANY ($1) RETURNING *)'
                       ' INSERT INTO %I SELECT * FROM moved', message_table, message_default) USING keep;
        EXECUTE format('ALTER TABLE %I ENABLE TRIGGER USER', message_default);
        EXECUTE format('WITH moved AS (DELETE FROM %I WHERE message_id = ANY ($1) RETURNING *)'
                       ' INSERT INTO %I SELECT * FROM moved', attempt_table, attempt_default) USING keep;
    END IF;
    INSERT INTO pgmb_archive_day (run_id, day, message_table, attempt_table, kept)
    VALUES (run, day, message_table, attempt_table, cardinality(keep));
    RETURN cardinality(keep);
END $$;

-- Closed, as every function of pgmb's but the reviewed list (access.sql).
REVOKE EXECUTE ON FUNCTION pgmb.claim_history_day(bigint, date, timestamptz) FROM PUBLIC;

-- pgmb_admin's grants on the new table, as pgmb.apply_access gives every pgmb_* table.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgmb_admin') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON pgmb_archive_day TO pgmb_admin;
        GRANT USAGE, SELECT ON SEQUENCE pgmb_archive_day_id_seq TO pgmb_admin;
    END IF;
END $$;

-- ==== Answers that stop retries ====
-- A worker's dead_statuses and retried_statuses (the columns are Django's, added before
-- this file runs) and its abort header: checked by the worker's trigger, decided where a
-- failure is settled (docs/decisions/0080-answers-that-stop-retries.md). No function
-- 0.1.1's dispatchers call changes its arguments or results; their failures go on being
-- settled by pgmb.settle_failures, which now also reads the worker's lists.

-- A worker's answers that stop retries (docs/delivery.md, Answers that stop retries): the
-- rules of pgmb.final_answers in Python (one table of cases runs both, tests/rules).
-- An entry of dead_statuses is a status (100 to 599, not a 2xx: that is a success) or a
-- class of them (1xx, 3xx, 4xx, 5xx); one of retried_statuses a status only. What is wrong
-- with a list (NULL: nothing), the first bad entry named.
CREATE OR REPLACE FUNCTION pgmb.statuses_problem(entries text[], classes boolean) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN entries IS NULL THEN 'a list is required (empty: none)'
           -- Quoted as pgmb.final_answers quotes it (no E'' form for a backslash).
           ELSE (SELECT coalesce('''' || replace(u.e, '''', '''''') || '''', 'NULL') || ' is not '
                        || CASE WHEN classes
                                THEN 'an HTTP status (100 to 599, not 2xx) or a class of them (1xx, 3xx, 4xx or 5xx)'
                                ELSE 'an HTTP status (100 to 599, not 2xx)' END
                 FROM unnest(entries) WITH ORDINALITY AS u(e, n)
                 WHERE NOT coalesce(lower(btrim(u.e, E' \t'))
                                    ~ CASE WHEN classes THEN '^(?:[1345][0-9][0-9]|[1345]xx)$'
                                           ELSE '^[1345][0-9][0-9]$' END, false)
                 ORDER BY u.n LIMIT 1) END
$$;

-- A valid list as stored: each entry trimmed and lower-cased, once, in byte order.
CREATE OR REPLACE FUNCTION pgmb.statuses_normalised(entries text[]) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(DISTINCT lower(btrim(u.e, E' \t')) COLLATE "C"
                              ORDER BY lower(btrim(u.e, E' \t')) COLLATE "C"), '{}')
    FROM unnest(entries) AS u(e)
$$;

-- Both lists of a worker checked and stored normalised, or refused naming what is wrong: a
-- status in both lists is refused (which would win is not for pgmb to guess).
CREATE OR REPLACE FUNCTION pgmb.check_final_answers(w public.pgmb_worker) RETURNS public.pgmb_worker
LANGUAGE plpgsql AS $$
DECLARE
    problem text;
    twice text;
BEGIN
    problem := pgmb.statuses_problem(w.dead_statuses, true);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid dead_statuses for worker %: %', w.name, problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'List statuses such as 410 or classes such as 4xx; an empty list retries every failure.';
    END IF;
    problem := pgmb.statuses_problem(w.retried_statuses, false);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid retried_statuses for worker %: %', w.name, problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'List statuses such as 408 or 429 that dead_statuses names the class of.';
    END IF;
    w.dead_statuses := pgmb.statuses_normalised(w.dead_statuses);
    w.retried_statuses := pgmb.statuses_normalised(w.retried_statuses);
    twice := (SELECT min(s) FROM unnest(w.retried_statuses) AS s WHERE s = ANY (w.dead_statuses));
    IF twice IS NOT NULL THEN
        RAISE EXCEPTION 'invalid retried_statuses for worker %: % is in dead_statuses too', w.name, twice
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN w;
END $$;

-- The header by which a worker asks that a failed delivery be dead-lettered at once, and
-- its value (compared trimmed of blanks, in any case): Pgmb-Delivery: abort. A transport
-- that reads it on a non-2xx answer begins the attempt's error with pgmb.aborted_prefix().
-- Named once here and in pgmb.final_answers (tests/rules/test_loop_constants.py).
CREATE OR REPLACE FUNCTION pgmb.abort_header() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 'pgmb-delivery' $$;

-- The header's value that asks for it.
CREATE OR REPLACE FUNCTION pgmb.abort_value() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 'abort' $$;

-- pgmb writes this; no worker can: a worker's answer reaches the error only after "HTTP ".
CREATE OR REPLACE FUNCTION pgmb.aborted_prefix() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 'the worker answered Pgmb-Delivery: abort, so it is dead-lettered at once: '
$$;

-- Whether a failed attempt's answer ends its delivery at once (pgmb.settle_failures), and
-- the note that the dead letter's error then begins with ('' when the error says why
-- already); NULL: retried as usual. Either the worker answered with the abort header
-- (its transport then began the error with pgmb.aborted_prefix()), or with a status of its
-- dead_statuses, named there or by its class, and not in its retried_statuses. An answer
-- with no status (a timeout, a refused connection) never stops retries. Inlined into the
-- statement that calls it (it calls nothing that is not IMMUTABLE, so no format()): a
-- call of its own would cost pgmb.settle_failures a quarter more CPU.
CREATE OR REPLACE FUNCTION pgmb.final_answer_note(status integer, error text, dead text[], retried text[])
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN status IS NULL THEN NULL
                WHEN starts_with(coalesce(error, ''), pgmb.aborted_prefix()) THEN ''
                WHEN dead = '{}' THEN NULL
                WHEN status::text = ANY (dead)
                     OR ((status / 100)::text || 'xx' = ANY (dead) AND NOT status::text = ANY (retried))
                THEN 'the worker answered ' || status::text || ', which it dead-letters at once: '
           END
$$;

-- The function of pgmb_worker's BEFORE INSERT trigger and of its BEFORE UPDATE OF every
-- column but the token bucket's (models.WORKER_RULED_COLUMNS; a claim's refill of the
-- bucket runs no rule): the name, endpoint, rate, timeout, cap on requests in flight and
-- secret rules for every writer (an unchanged endpoint or secret stays accepted: a row
-- stored before a rule can still be paused), then the circuit breaker's settings
-- (pgmb.check_breaker) and the answers that stop retries (pgmb.check_final_answers).
CREATE OR REPLACE FUNCTION pgmb.prepare_worker(w public.pgmb_worker) RETURNS public.pgmb_worker
    LANGUAGE plpgsql
    AS $_$
DECLARE
    problem text;
BEGIN
    PERFORM pgmb.check_name('worker', w.name);
    IF (w.endpoint IS NULL
        OR w.endpoint !~ '^[Hh][Tt][Tt][Pp][Ss]?://(?:[^/?#\[\]\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]*@)?(?:\[[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\]|[^/?#@\[\]:\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]+)(?::(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])?)?(?:[/?#][^\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]*)?$')
       AND NOT EXISTS (SELECT 1 FROM pgmb_worker o WHERE o.id = w.id AND o.endpoint = w.endpoint) THEN
        -- Named with its credentials masked: an error text reaches logs and screens.
        RAISE EXCEPTION 'invalid endpoint % for worker %', quote_nullable(pgmb.mask_credentials(w.endpoint)), w.name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The endpoint must be an http:// or https:// URL without blanks, its host a name, an IPv4 address or an IPv6 address in brackets, its port (if any) from 1 to 65535.';
    END IF;
    IF w.rps IS NULL OR w.rps <= 0 THEN
        RAISE EXCEPTION 'invalid rps % for worker %: it must be at least 1 request per second', w.rps, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.timeout IS NULL OR w.timeout <= 0 THEN
        RAISE EXCEPTION 'invalid timeout % for worker %: it must be positive', w.timeout, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.max_in_flight < 1 THEN
        RAISE EXCEPTION 'invalid max_in_flight % for worker %: it must be at least 1 request in flight',
                        w.max_in_flight, w.name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'NULL (the default) sets no cap.';
    END IF;
    problem := pgmb.new_secret_problem(w.secret);
    IF problem IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM pgmb_worker o WHERE o.id = w.id AND o.secret = w.secret) THEN
        RAISE EXCEPTION 'invalid secret for worker %: %', w.name, problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use whsec_ and the base64 of at least 16 bytes (padded or not), or a text of at least 16 bytes without control characters.';
    END IF;
    w := pgmb.check_breaker(w);
    w := pgmb.check_final_answers(w);
    RETURN w;
END $_$;

CREATE OR REPLACE FUNCTION pgmb.settle_failures(delivery_ids bigint[], lease_ids uuid[], statuses integer[], errors text[], retry_after double precision[], durations_ms double precision[], retry_outcome text) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
    AS $$
DECLARE
    settled integer;
BEGIN
    PERFORM pgmb.breaker_settle(delivery_ids, lease_ids, statuses, errors, false);  -- circuit breakers (breakers.sql)
    PERFORM pgmb.wake_for_slots(delivery_ids);  -- a capped worker's slots
    WITH input AS (
        SELECT * FROM unnest(delivery_ids, lease_ids, statuses, errors, retry_after, durations_ms)
            AS u(id, lease_id, status, error, retry_after, duration_ms)
    ), target AS (
        SELECT d.id, d.message_id, d.queue_id, d.attempts, u.status,
               left(coalesce(f.note, '') || coalesce(u.error, ''), 2000) AS error,
               u.retry_after, u.duration_ms,
               d.attempts >= 1 + coalesce(m.max_retries, q.max_retries) OR f.note IS NOT NULL AS exhausted,
               d.canceled_at IS NOT NULL AS canceled,
               q.backoff_base, q.backoff_max, m.retry_delay
        FROM input u
        JOIN pgmb_delivery d ON d.id = u.id AND d.id = ANY (delivery_ids) AND d.lease_id = u.lease_id AND d.state = 'leased'
        JOIN pgmb_queue q ON q.id = d.queue_id
        JOIN pgmb_message m ON m.id = d.message_id
        -- A pull queue has no worker; its reads' leases come here when they expire.
        LEFT JOIN pgmb_worker w ON w.id = q.worker_id
        CROSS JOIN LATERAL (SELECT pgmb.final_answer_note(u.status, u.error, w.dead_statuses, w.retried_statuses) AS note) f
        FOR UPDATE OF d
    ), dead AS (
        DELETE FROM pgmb_delivery d USING target t
        WHERE d.id = t.id AND d.id = ANY (delivery_ids) AND (t.exhausted OR t.canceled)
        RETURNING d.id
    ), buried AS (
        INSERT INTO pgmb_dead_letter (message_id, queue_id, attempts, last_status, last_error, created_at)
        SELECT t.message_id, t.queue_id, t.attempts, t.status, t.error, clock_timestamp()
        FROM target t JOIN dead ON dead.id = t.id
        WHERE NOT t.canceled
        ON CONFLICT (message_id, queue_id) DO UPDATE
        SET attempts = excluded.attempts, last_status = excluded.last_status,
            last_error = excluded.last_error, created_at = excluded.created_at
        -- The event of each dead letter (events.sql): evaluated for the rows buried only,
        -- so a batch where nothing dies calls nothing.
        RETURNING pgmb.dead_letter_event(message_id, queue_id, attempts, last_status, last_error)
    ), retried AS (
        UPDATE pgmb_delivery d
        SET state = 'ready', lease_id = NULL, last_status = t.status, last_error = t.error,
            available_at = clock_timestamp()
                + CASE WHEN t.retry_delay IS NOT NULL
                       THEN greatest(least(coalesce(t.retry_after, 0), 86400), t.retry_delay)
                       ELSE pgmb.retry_delay(t.attempts, t.backoff_base, t.backoff_max, t.retry_after)
                  END * interval '1 second'
        FROM target t
        WHERE d.id = t.id AND d.id = ANY (delivery_ids) AND NOT t.exhausted AND NOT t.canceled
        RETURNING 1
    ), history AS (
        INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
        SELECT t.message_id, t.queue_id, t.attempts,
               CASE WHEN t.canceled THEN 'canceled' WHEN t.exhausted THEN 'dead' ELSE retry_outcome END,
               t.status, t.duration_ms,
               CASE WHEN t.canceled THEN left(pgmb.canceled_in_flight() || ': ' || t.error, 2000) ELSE t.error END,
               clock_timestamp()
        FROM target t
        RETURNING 1
    )
    -- Data-modifying CTEs always run to completion, read or not.
    SELECT count(*)::integer INTO settled FROM history;
    RETURN settled;
END $$;

-- Closed, as every function of pgmb's but the reviewed list (access.sql).
REVOKE EXECUTE ON FUNCTION
    pgmb.statuses_problem(text[], boolean),
    pgmb.statuses_normalised(text[]),
    pgmb.check_final_answers(public.pgmb_worker),
    pgmb.abort_header(),
    pgmb.abort_value(),
    pgmb.aborted_prefix(),
    pgmb.final_answer_note(integer, text, text[], text[])
FROM PUBLIC;

-- ==== A cap on requests in flight ====
-- A worker's max_in_flight (the column is Django's, added before this file runs; NULL: no
-- cap): checked by the worker's trigger and a CHECK, held by the claim, which counts a
-- capped worker's unexpired leases (docs/decisions/0081-a-cap-on-requests-in-flight.md).
-- No function 0.1.1's dispatchers call changes its arguments or results: their claims go
-- through pgmb.claim, so they keep to the cap too.

ALTER TABLE pgmb_worker
    ADD CONSTRAINT pgmb_worker_max_in_flight_positive CHECK (max_in_flight >= 1);

-- Capped workers (max_in_flight): an outcome writer looks here first and, with none, does
-- nothing more for the cap (pgmb.wake_for_slots).
CREATE INDEX IF NOT EXISTS pgmb_worker_capped ON pgmb_worker (id) WHERE max_in_flight IS NOT NULL;

-- How many more requests a worker capped at `cap` (pgmb_worker.max_in_flight) may have in
-- flight at t: the cap less its deliveries that are leased and whose lease has not run out
-- (a crashed dispatcher's slots come back as its leases end), never below 0. Called by the
-- claim only for a capped worker, its row locked: claims of one worker take turns, and each
-- counts what the last one committed. The leases are read through pgmb_delivery_leased
-- (every worker's leases in flight, a few hundred at most): an index by queue would cost
-- every lease of every worker. PL/pgSQL: its plan is kept for the session.
CREATE OR REPLACE FUNCTION pgmb.free_slots(worker_id uuid, cap integer, t timestamptz) RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN greatest(0, cap - (
        SELECT count(*)::integer FROM (
            SELECT FROM pgmb_delivery d
            WHERE d.state = 'leased' AND d.available_at > t
              AND d.queue_id IN (SELECT qu.id FROM pgmb_queue qu WHERE qu.worker_id = free_slots.worker_id)
            LIMIT cap) AS in_flight));
END $$;

-- When a capped worker that is full gets a slot back at the latest: the first of its leases
-- to run out (an outcome recorded earlier frees one sooner, and wakes waiting dispatchers,
-- pgmb.wake_for_slots). NULL when a slot is free now. For pgmb.next_wakeup.
CREATE OR REPLACE FUNCTION pgmb.slot_free_at(worker_id uuid, cap integer) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t timestamptz := clock_timestamp();
BEGIN
    IF pgmb.free_slots(worker_id, cap, t) > 0 THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT min(d.available_at) FROM pgmb_delivery d
            WHERE d.state = 'leased' AND d.available_at > t
              AND d.queue_id IN (SELECT qu.id FROM pgmb_queue qu WHERE qu.worker_id = slot_free_at.worker_id));
END $$;

-- Outcomes about to be recorded free their workers' slots: if one of these deliveries is a
-- capped worker's, dispatchers that wait are woken (pgmb.wake_dispatchers; none waits: no
-- NOTIFY). With no capped worker (pgmb_worker_capped is empty) nothing more is read.
CREATE OR REPLACE FUNCTION pgmb.wake_for_slots(delivery_ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM pgmb_worker wk WHERE wk.max_in_flight IS NOT NULL)
       AND EXISTS (SELECT FROM pgmb_delivery d
                   JOIN pgmb_queue qu ON qu.id = d.queue_id
                   JOIN pgmb_worker wk ON wk.id = qu.worker_id
                   WHERE d.id = ANY (delivery_ids) AND wk.max_in_flight IS NOT NULL) THEN
        PERFORM pgmb.wake_dispatchers();
    END IF;
END $$;

-- Seconds until something may be claimable for these queues (NULL: nothing pending):
-- the next due delivery (the first per priority, pgmb.next_due), the next token of a
-- rate-limited worker, the next lease to expire, the end of a circuit breaker's cool-down.
-- PL/pgSQL for its kept plan, as pgmb.ack: the dispatchers ask this after most claims.
CREATE OR REPLACE FUNCTION pgmb.next_wakeup(queue_names text[]) RETURNS float8
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT CASE WHEN min(at) IS NOT NULL
                THEN greatest(0, extract(epoch FROM min(at) - clock_timestamp()))::float8 END
    FROM (
        SELECT CASE WHEN due IS NOT NULL
                    THEN greatest(due, tokens_at + (1 - least(tokens, 1)) / rps * interval '1 second', breaker_until,
                                  slot_at)
               END AS at
        FROM (
            -- A fair queue's keys at their cap are not due (fairness.sql).
            SELECT CASE WHEN qu.fairness_header IS NULL THEN pgmb.next_due(qu.id) ELSE pgmb.fair_next_due(qu.id) END AS due,
                   wk.tokens, coalesce(wk.tokens_at, '-infinity') AS tokens_at, wk.rps, wk.breaker_until,
                   CASE WHEN wk.max_in_flight IS NOT NULL THEN pgmb.slot_free_at(wk.id, wk.max_in_flight) END AS slot_at
            FROM pgmb_queue qu JOIN pgmb_worker wk ON wk.id = qu.worker_id
            WHERE NOT qu.paused AND wk.active AND (queue_names IS NULL OR qu.name = ANY (queue_names))
        ) AS per_queue
        UNION ALL
        SELECT min(d.available_at) FROM pgmb_delivery d JOIN pgmb_queue qu ON qu.id = d.queue_id
        WHERE d.state = 'leased' AND (queue_names IS NULL OR qu.name = ANY (queue_names))
        -- The next schedule to fire (schedules.sql), one look in pgmb_schedule_due: only one
        -- still to come, so that a schedule overdue wakes no loop that does not fire it
        -- (0.1.1's dispatchers would otherwise spin); the loops that fire schedules keep
        -- their own time for the overdue ones.
        UNION ALL
        SELECT min(sc.next_run_at) FROM pgmb_schedule sc
        WHERE NOT sc.paused AND sc.next_run_at > clock_timestamp()
    ) AS candidates);
END $$;

-- Leases up to max_count due deliveries of the named queues (all when NULL), most urgent
-- first (priority, due time, publish order), within each worker's rate limit and circuit
-- breaker; counts the attempt. The scans that an estimate could pick over a queue's index
-- are turned off in the hot statements of the claim, pgmb.start, pgmb.ack and
-- pgmb.settle_failures: made from stale statistics (a drained table looks empty over many
-- pages), a plan would otherwise read the whole table. Rows are found through the primary
-- key (id = ANY (...)), and the claim picks into an array first and returns its rows in the
-- order picked. With those scans and sorts off, each of these functions' statements has
-- one plan whatever the statistics say or how many ids a call passes, so each keeps one
-- generic plan a session (plan_cache_mode): planned at every call, a claim would spend half
-- its CPU planning, a start or an ack of one delivery (the in-database loop's) a third;
-- a claim of one row (a dispatcher woken by one message) is what the latency of a
-- delivery waits for (tests/sql/test_steady_plans.py reads their plans).
CREATE OR REPLACE FUNCTION pgmb.claim(queue_names text[] DEFAULT NULL::text[], max_count integer DEFAULT 100) RETURNS SETOF pgmb.claimed
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
    SET enable_sort = off
    AS $$
DECLARE
    t timestamptz := clock_timestamp();
    lease uuid := gen_random_uuid();
    remaining integer := max_count;
    w record;
    q uuid;
    tokens integer;
    got integer;
    breaker text;
    bucket float8;
    taken integer;
    picked bigint[];
    secrets text[];
    cap integer;
BEGIN
    FOR w IN
        SELECT wk.id, array_agg(qu.id ORDER BY random()) AS queue_ids,
               array_agg(qu.id) FILTER (WHERE qu.fairness_header IS NOT NULL) AS fair_ids
        FROM pgmb_queue qu JOIN pgmb_worker wk ON wk.id = qu.worker_id
        WHERE NOT qu.paused AND wk.active
          AND (wk.breaker_until IS NULL OR wk.breaker_until <= t)  -- an open circuit breaker (breakers.sql)
          AND (queue_names IS NULL OR qu.name = ANY (queue_names))
          -- The queue's first entry (its most urgent priority's earliest) is due, mostly;
          -- if not, one probe per further priority (pgmb.next_due).
          AND CASE WHEN (SELECT d.available_at FROM pgmb_delivery d
                         WHERE d.queue_id = qu.id AND d.state = 'ready'
                         ORDER BY d.priority, d.available_at LIMIT 1) <= t THEN true
                   ELSE pgmb.next_due(qu.id, t) <= t END
        GROUP BY wk.id
        ORDER BY random()
    LOOP
        EXIT WHEN remaining <= 0;
        -- The bucket is the worker row. If another claim holds it right now, that claim is
        -- serving this worker: skip it rather than wait (as with deliveries). Refilled here,
        -- written once below, less what was taken.
        SELECT least(greatest(1, wk.rps * wk.burst),
                     wk.tokens + wk.rps * extract(epoch FROM t - coalesce(wk.tokens_at, t - interval '1 day'))),
               wk.breaker_state,
               -- Once per worker, not per row: what signs its requests (rotation, routing.sql).
               pgmb.signing_secrets(wk.secret, wk.id, t),
               wk.max_in_flight
        INTO bucket, breaker, secrets, cap
        FROM pgmb_worker wk WHERE wk.id = w.id
        FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        tokens := least(floor(bucket)::integer, remaining);
        -- A cap on requests in flight: only a capped worker counts its leases (pgmb.free_slots).
        IF cap IS NOT NULL THEN tokens := least(tokens, pgmb.free_slots(w.id, cap, t)); END IF;
        -- Circuit breaker (breakers.sql): open, nothing; after its cool-down, one delivery (the probe).
        IF breaker <> 'closed' THEN tokens := pgmb.breaker_admit(w.id, tokens, t, lease); END IF;
        taken := 0;
        -- Queue by queue, so each claim is an ordered scan of one queue's partial index.
        FOREACH q IN ARRAY w.queue_ids LOOP
            EXIT WHEN tokens <= 0;
            -- A queue with a fairness header takes its keys in turn (fairness.sql); the
            -- others, the pick below as it stands.
            IF q = ANY (w.fair_ids) THEN
                picked := pgmb.fair_pick(q, tokens, t);
            ELSE
                -- The pick, an ordered scan of this queue's part of pgmb_delivery_due; the
                -- rows picked are then found by primary key, whatever the planner thinks of
                -- the table.
                picked := ARRAY(
                    SELECT d.id FROM pgmb_delivery d
                    WHERE d.queue_id = q AND d.state = 'ready' AND d.available_at <= t
                      AND (d.expires_at IS NULL OR d.expires_at > t)  -- expired: pgmb.expire's
                    ORDER BY d.priority, d.available_at, d.id
                    LIMIT tokens
                    FOR NO KEY UPDATE SKIP LOCKED);
            END IF;
            CONTINUE WHEN cardinality(picked) = 0;
            RETURN QUERY
            WITH leased AS (
                -- The attempt is counted now and handed back if the lease expires unstarted.
                UPDATE pgmb_delivery d
                SET state = 'leased', attempts = d.attempts + 1, lease_id = lease, started = false,
                    available_at = t + least(qu.lease_seconds, 2592000) * interval '1 second'
                FROM pgmb_queue qu
                WHERE d.id = ANY (picked) AND qu.id = d.queue_id
                RETURNING d.id, d.attempts, qu.max_retries, d.queue_id, qu.name,
                          d.message_id, qu.lease_seconds
            )
            SELECT l.id, lease, l.attempts, 1 + coalesce(m.max_retries, l.max_retries), l.queue_id,
                   l.name::text, m.id, m.routing_key::text, m.body::text, m.headers, m.created_at,
                   wk.id, wk.endpoint::text, wk.timeout, secrets, wk.rps, l.lease_seconds
            FROM unnest(picked) WITH ORDINALITY AS p(id, n)
            JOIN leased l ON l.id = p.id
            JOIN pgmb_message m ON m.id = l.message_id
            JOIN pgmb_worker wk ON wk.id = w.id
            -- In the order picked.
            ORDER BY p.n;
            GET DIAGNOSTICS got = ROW_COUNT;
            tokens := tokens - got;
            remaining := remaining - got;
            taken := taken + got;
        END LOOP;
        UPDATE pgmb_worker wk SET tokens = bucket - taken, tokens_at = t WHERE wk.id = w.id;
    END LOOP;
END $$;

-- Records successful attempts: the deliveries are deleted and their attempts written to the
-- history (outcome 'ack'; 'canceled' for a delivery cancelled while its request was in
-- flight, pgmb.cancel); the circuit breakers hear of them first. Planned as pgmb.claim.
CREATE OR REPLACE FUNCTION pgmb.ack(delivery_ids bigint[], statuses integer[] DEFAULT NULL::integer[], durations_ms double precision[] DEFAULT NULL::double precision[]) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
    AS $$
DECLARE
    acked integer;
BEGIN
    PERFORM pgmb.breaker_settle(delivery_ids, NULL, statuses, NULL, true);  -- circuit breakers (breakers.sql)
    PERFORM pgmb.wake_for_slots(delivery_ids);  -- a capped worker's slots
    WITH input AS (
        SELECT * FROM unnest(delivery_ids, statuses, durations_ms) AS u(id, status, duration_ms)
    ), done AS (
        DELETE FROM pgmb_delivery d USING input u WHERE d.id = u.id AND d.id = ANY (delivery_ids)
        RETURNING d.id, d.message_id, d.queue_id, d.attempts, d.canceled_at
    ), history AS (
        INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
        SELECT done.message_id, done.queue_id, done.attempts,
               CASE WHEN done.canceled_at IS NULL THEN 'ack' ELSE 'canceled' END,
               u.status, u.duration_ms,
               CASE WHEN done.canceled_at IS NULL THEN '' ELSE pgmb.canceled_in_flight() END,
               clock_timestamp()
        FROM done JOIN input u ON u.id = done.id
        RETURNING 1
    )
    SELECT count(*)::integer INTO acked FROM history;
    RETURN acked;
END $$;

-- Closed, as every function of pgmb's but the reviewed list (access.sql).
REVOKE EXECUTE ON FUNCTION
    pgmb.free_slots(uuid, integer, timestamptz),
    pgmb.slot_free_at(uuid, integer),
    pgmb.wake_for_slots(bigint[])
FROM PUBLIC;

-- ==== Fair shares per key ====

-- Fair shares per key (docs/fairness.md, docs/decisions/0082-fair-shares-per-key.md). A
-- queue may name a header as its fairness key (pgmb.fairness): its claims then take the
-- keys in turn, least recently served first, each key `weight` deliveries a turn, instead
-- of oldest first; a key may be capped (requests in flight) and rate-limited. A queue
-- without one is claimed as before and pays nothing: the routing trigger copies no header,
-- no row reaches the indexes or the trigger below, and the claim's pick is its own.

-- The queue's fairness header (NULL: off), and each delivery's value of it (copied by the
-- routing trigger for a queue that names one; '' for a message without the header).
-- Defaults NULL: adding them writes no row, and 0.1.1's statements do not name them.
ALTER TABLE pgmb_queue ADD COLUMN IF NOT EXISTS fairness_header text;
ALTER TABLE pgmb_queue DROP CONSTRAINT IF EXISTS pgmb_queue_fairness_header_valid;
ALTER TABLE pgmb_queue ADD CONSTRAINT pgmb_queue_fairness_header_valid
    CHECK (fairness_header IS NULL OR pgmb.valid_key(fairness_header));
ALTER TABLE pgmb_delivery ADD COLUMN IF NOT EXISTS fair_key text;

-- A delivery's fairness key on a queue with fairness header `header` (NULL: none): the
-- header's value, '' for a message without it. Every writer of deliveries sets it so (the
-- routing trigger, pgmb.requeue, pgmb.replay): a fair queue picks only rows with a key.
-- Inlined where it is called: no call per message.
CREATE OR REPLACE FUNCTION pgmb.delivery_fair_key(header text, headers jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN header IS NOT NULL THEN coalesce(headers ->> header, '') END $$;

-- A key's ready deliveries in claim order, and its requests in flight (the cap): one
-- index for both, which only rows of fair queues enter (every write of a delivery tests
-- each partial index's predicate: one is cheaper for the others than two).
CREATE INDEX IF NOT EXISTS pgmb_delivery_fair ON pgmb_delivery (queue_id, fair_key, state, priority, available_at, id)
    WHERE fair_key IS NOT NULL;

-- One row per key of a fair queue: its settings (weight, max_in_flight, rps; written
-- through pgmb.fair_key, the CHECKs hold for every writer) and its turn (served_at, the
-- credit left of a turn a claim cut short, the rate bucket). Made by the first delivery of
-- the key (pgmb.note_fair_key). No foreign key, as pgmb.queue_grant: Django's flush
-- truncates pgmb_queue alone; the queue's deletion takes its rows (pgmb.forget_fair_keys).
CREATE TABLE IF NOT EXISTS pgmb.fair_key (
    queue_id uuid NOT NULL,
    key text NOT NULL,
    weight integer NOT NULL DEFAULT 1 CONSTRAINT fair_key_weight_valid CHECK (weight BETWEEN 1 AND 1000),
    max_in_flight integer CONSTRAINT fair_key_max_in_flight_valid CHECK (max_in_flight >= 1),
    rps double precision CONSTRAINT fair_key_rps_valid CHECK (rps > 0 AND rps < 'Infinity'::float8),
    served_at timestamptz,
    credit integer,
    tokens double precision,
    tokens_at timestamptz,
    CONSTRAINT fair_key_pkey PRIMARY KEY (queue_id, key)
);
-- The claim's order of turns.
CREATE INDEX IF NOT EXISTS fair_key_turn ON pgmb.fair_key (queue_id, served_at NULLS FIRST, key);

-- After a delivery with a fairness key is stored: its key's row, if it has none yet.
CREATE OR REPLACE FUNCTION pgmb.note_fair_key() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM FROM pgmb.fair_key k WHERE k.queue_id = NEW.queue_id AND k.key = NEW.fair_key;
    IF NOT FOUND THEN
        INSERT INTO pgmb.fair_key (queue_id, key) VALUES (NEW.queue_id, NEW.fair_key)
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS pgmb_delivery_fair_key ON pgmb_delivery;
CREATE TRIGGER pgmb_delivery_fair_key AFTER INSERT OR UPDATE OF fair_key ON pgmb_delivery
    FOR EACH ROW WHEN (NEW.fair_key IS NOT NULL) EXECUTE FUNCTION pgmb.note_fair_key();

-- A deleted queue's keys go with it.
CREATE OR REPLACE FUNCTION pgmb.forget_fair_keys() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM pgmb.fair_key k WHERE k.queue_id = OLD.id;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS pgmb_queue_fair_keys ON pgmb_queue;
CREATE TRIGGER pgmb_queue_fair_keys AFTER DELETE ON pgmb_queue
    FOR EACH ROW WHEN (OLD.fairness_header IS NOT NULL) EXECUTE FUNCTION pgmb.forget_fair_keys();

-- The queue's id by name, or 22023 naming the queue.
CREATE OR REPLACE FUNCTION pgmb.fair_queue_id(queue_name text) RETURNS uuid
LANGUAGE plpgsql STABLE AS $$
DECLARE
    found_id uuid;
BEGIN
    SELECT q.id INTO found_id FROM pgmb_queue q WHERE q.name = queue_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown queue %', quote_nullable(queue_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN found_id;
END $$;

-- Names the header whose value is a queue's fairness key (NULL: off, claims oldest first
-- again). The queue's live deliveries take their key from it at once (with none, the
-- ones stored before would never be picked), and every key's turn starts afresh. Returns
-- the queue's id.
CREATE OR REPLACE FUNCTION pgmb.fairness(queue_name text, header text) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    qid uuid := pgmb.fair_queue_id(queue_name);
BEGIN
    IF header IS NOT NULL AND NOT pgmb.valid_key(header) THEN
        RAISE EXCEPTION 'invalid fairness header %: 1 to 255 characters without blanks or control characters',
                        quote_literal(header)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Taken first, so that no publish routes to the queue with the old header meanwhile.
    PERFORM FROM pgmb_queue q WHERE q.id = qid FOR UPDATE;
    UPDATE pgmb_queue q SET fairness_header = header
    WHERE q.id = qid AND q.fairness_header IS DISTINCT FROM header;
    IF FOUND THEN
        -- Turns start afresh; the keys' own settings stay, those with none go.
        DELETE FROM pgmb.fair_key k
        WHERE k.queue_id = qid AND k.weight = 1 AND k.max_in_flight IS NULL AND k.rps IS NULL;
        UPDATE pgmb.fair_key k SET served_at = NULL, credit = NULL, tokens = NULL, tokens_at = NULL
        WHERE k.queue_id = qid;
        -- Each live delivery's key (its row is made by pgmb.note_fair_key).
        UPDATE pgmb_delivery d
        SET fair_key = pgmb.delivery_fair_key(header, m.headers)
        FROM pgmb_message m
        WHERE d.queue_id = qid AND m.id = d.message_id;
        PERFORM pgmb.wake_dispatchers();
    END IF;
    RETURN qid;
END $$;

-- Sets a key's settings on a fair queue: its weight (deliveries per turn, 1 to 1000), its
-- cap on requests in flight (NULL: none; 1 delivers the key's messages one at a time, as
-- an ordered group does, though not strictly in order across retries) and its rate limit
-- in requests a second (NULL: none). The key need not have been seen yet, nor the
-- queue name its header yet: the settings apply while it does.
CREATE OR REPLACE FUNCTION pgmb.fair_key(queue_name text, key text, weight integer DEFAULT 1,
                                         max_in_flight integer DEFAULT NULL, rps float8 DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    qid uuid := pgmb.fair_queue_id(queue_name);
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'invalid fairness key: NULL (a message without the header has the key '''')'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF weight IS NULL OR weight < 1 OR weight > 1000 THEN
        RAISE EXCEPTION 'invalid weight %: a whole number from 1 to 1000', coalesce(weight::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_in_flight < 1 THEN
        RAISE EXCEPTION 'invalid max_in_flight %: at least 1 (NULL: no cap)', max_in_flight
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (rps > 0 AND rps < 'Infinity'::float8) THEN
        RAISE EXCEPTION 'invalid rps %: a positive, finite number (NULL: no limit)', rps
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pgmb.fair_key AS k (queue_id, key, weight, max_in_flight, rps)
    VALUES (qid, fair_key.key, fair_key.weight, fair_key.max_in_flight, fair_key.rps)
    ON CONFLICT ON CONSTRAINT fair_key_pkey DO UPDATE
    SET weight = excluded.weight, max_in_flight = excluded.max_in_flight, rps = excluded.rps,
        tokens = CASE WHEN excluded.rps IS NULL THEN NULL ELSE least(k.tokens, greatest(1, excluded.rps)) END;
END $$;

-- The pick of pgmb.claim for a queue with a fairness header: up to `wanted` ids of due
-- deliveries, locked. The keys with due deliveries are taken least recently served first
-- (locked, SKIP LOCKED: concurrent claims serve different keys), each allowed what its
-- cap (in flight now) and its rate bucket leave; then round after round each key gets up
-- to its weight (the first round: what was left of a turn the last claim cut short) until
-- `wanted` are picked or no key has more. A served key's turn moves behind the others;
-- the ids are returned round by round. Planned as pgmb.claim.
CREATE OR REPLACE FUNCTION pgmb.fair_pick(q uuid, wanted integer, t timestamptz) RETURNS bigint[]
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
    AS $$
DECLARE
    keys text[];
    weights integer[];
    credits integer[];
    allowed integer[];
    buckets float8[];
    given integer[];
    last_turn integer[];
    n integer;
    i integer;
    give integer;
    quota integer;
    left_over integer := wanted;
    turn integer := 0;
    round integer := 0;
    progress boolean;
    cut integer := 0;
    cut_credit integer;
    part bigint[];
    ids bigint[] := '{}';
    places integer[] := '{}';
    ranks integer[] := '{}';
BEGIN
    keys := ARRAY(
        SELECT k.key FROM pgmb.fair_key k
        WHERE k.queue_id = q
          AND EXISTS (SELECT FROM pgmb_delivery d
                      WHERE d.queue_id = q AND d.fair_key = k.key AND d.state = 'ready' AND d.available_at <= t
                        AND (d.expires_at IS NULL OR d.expires_at > t))
        ORDER BY k.served_at NULLS FIRST, k.key
        LIMIT wanted
        FOR UPDATE OF k SKIP LOCKED);
    n := cardinality(keys);
    IF n = 0 THEN
        RETURN '{}';
    END IF;
    -- What each key may have: a statement of its own, after the keys are locked, so that
    -- it sees the leases of the claim that held a key before (committed by then) and a cap
    -- holds across claims; a lease that ran out is not counted (a killed dispatcher's slots
    -- come back with it, as a worker's cap's do). wanted + 1 stands for "more than this
    -- claim takes".
    SELECT array_agg(k.weight ORDER BY u.n), array_agg(k.credit ORDER BY u.n),
           array_agg(least(
               CASE WHEN k.max_in_flight IS NULL THEN wanted + 1
                    ELSE k.max_in_flight - (SELECT count(*) FROM pgmb_delivery l
                                            WHERE l.queue_id = q AND l.fair_key = k.key AND l.state = 'leased'
                                              AND l.available_at > t) END,
               CASE WHEN k.rps IS NULL THEN wanted + 1 ELSE floor(b.bucket) END,
               (SELECT count(*) FROM (SELECT FROM pgmb_delivery d
                                      WHERE d.queue_id = q AND d.fair_key = k.key AND d.state = 'ready'
                                        AND d.available_at <= t
                                        AND (d.expires_at IS NULL OR d.expires_at > t)
                                      LIMIT wanted + 1) AS due))::integer ORDER BY u.n),
           array_agg(b.bucket ORDER BY u.n)
    INTO weights, credits, allowed, buckets
    FROM unnest(keys) WITH ORDINALITY AS u(key, n)
    JOIN pgmb.fair_key k ON k.queue_id = q AND k.key = u.key
    CROSS JOIN LATERAL (SELECT CASE WHEN k.rps IS NOT NULL THEN
                            least(greatest(1, k.rps),
                                  coalesce(k.tokens, greatest(1, k.rps))
                                  + k.rps * extract(epoch FROM t - coalesce(k.tokens_at, t)))
                        END AS bucket) AS b;
    given := array_fill(0, ARRAY[n]);
    last_turn := array_fill(0, ARRAY[n]);
    LOOP
        progress := false;
        FOR i IN 1..n LOOP
            EXIT WHEN left_over <= 0;
            quota := CASE WHEN round = 0 THEN coalesce(credits[i], weights[i]) ELSE weights[i] END;
            give := least(quota, allowed[i] - given[i]);
            CONTINUE WHEN give <= 0;
            -- The claim ends within this key's turn: the rest of it comes first next time.
            IF give > left_over THEN
                cut := i;
                cut_credit := quota - left_over;
                give := left_over;
            END IF;
            given[i] := given[i] + give;
            left_over := left_over - give;
            turn := turn + 1;
            last_turn[i] := turn;
            progress := true;
        END LOOP;
        EXIT WHEN left_over <= 0 OR NOT progress;
        round := round + 1;
    END LOOP;
    FOR i IN 1..n LOOP
        CONTINUE WHEN given[i] = 0;
        part := ARRAY(
            SELECT d.id FROM pgmb_delivery d
            WHERE d.queue_id = q AND d.fair_key = keys[i] AND d.state = 'ready' AND d.available_at <= t
              AND (d.expires_at IS NULL OR d.expires_at > t)  -- expired: pgmb.expire's
            ORDER BY d.priority, d.available_at, d.id
            LIMIT given[i]
            FOR NO KEY UPDATE SKIP LOCKED);
        given[i] := cardinality(part);
        ids := ids || part;
        places := places || array_fill(i, ARRAY[given[i]]);
        ranks := ranks || ARRAY(SELECT generate_series(1, given[i]));
    END LOOP;
    UPDATE pgmb.fair_key k
    SET served_at = CASE WHEN u.n = cut THEN k.served_at ELSE t + u.turn * interval '1 microsecond' END,
        credit = CASE WHEN u.n = cut THEN cut_credit END,
        tokens = u.bucket - u.taken,
        tokens_at = CASE WHEN u.bucket IS NOT NULL THEN t END
    FROM unnest(keys, given, last_turn, buckets) WITH ORDINALITY AS u(key, taken, turn, bucket, n)
    WHERE k.queue_id = q AND k.key = u.key AND u.taken > 0;
    -- Round by round: the r-th delivery of a key of weight w goes out in round (r - 1) / w.
    RETURN ARRAY(
        SELECT p.id FROM unnest(ids, places, ranks) AS p(id, place, rank)
        ORDER BY (p.rank - 1) / weights[p.place], p.place, p.rank);
END $$;

-- When a fair queue next has something a claim may take: the earliest due delivery of a
-- key under its cap, its rate bucket's next token counted in. NULL: nothing (every key
-- with due deliveries is at its cap: the lease's end or outcome frees it).
CREATE OR REPLACE FUNCTION pgmb.fair_next_due(q uuid) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
AS $$
BEGIN
    RETURN (
        SELECT min(greatest(h.due, CASE WHEN k.rps IS NOT NULL AND k.tokens IS NOT NULL
                                        THEN k.tokens_at + (1 - least(k.tokens, 1)) / k.rps * interval '1 second' END))
        FROM pgmb.fair_key k
        CROSS JOIN LATERAL (SELECT d.available_at AS due FROM pgmb_delivery d
                            WHERE d.queue_id = q AND d.fair_key = k.key AND d.state = 'ready'
                            ORDER BY d.priority, d.available_at LIMIT 1) AS h
        WHERE k.queue_id = q
          AND (k.max_in_flight IS NULL
               OR k.max_in_flight > (SELECT count(*) FROM pgmb_delivery l
                                     WHERE l.queue_id = q AND l.fair_key = k.key AND l.state = 'leased'
                                       AND l.available_at > clock_timestamp())));
END $$;

-- Closed by default (access.sql): the owner and pgmb_admin call these.
REVOKE EXECUTE ON FUNCTION pgmb.note_fair_key(), pgmb.forget_fair_keys(), pgmb.fair_queue_id(text),
    pgmb.fairness(text, text), pgmb.fair_key(text, text, integer, integer, double precision),
    pgmb.fair_pick(uuid, integer, timestamptz), pgmb.fair_next_due(uuid),
    pgmb.delivery_fair_key(text, jsonb)
FROM PUBLIC;

-- The claim calls pgmb.fair_pick for a fair queue, pgmb.next_wakeup asks
-- pgmb.fair_next_due, and requeue and replay set the fairness key (deliveries.sql).

-- Dead letters back to their queue: attempts start again, due now, with the message's
-- priority, group, dependencies and fairness key. A requeued delivery gets a new id: in its
-- group it goes behind the members already there (docs/ordering.md).
CREATE OR REPLACE FUNCTION pgmb.requeue(dead_letter_ids bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    WITH moved AS (
        DELETE FROM pgmb_dead_letter x WHERE x.id = ANY (dead_letter_ids)
        RETURNING x.message_id, x.queue_id
    )
    INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at, created_at,
                               priority, group_key, depends_on, dependents, fair_key)
    SELECT moved.message_id, moved.queue_id, 'ready', 0, now(), now(),
           m.priority, m.group_key, m.depends_on, pgmb.has_dependents(m.id),
           pgmb.delivery_fair_key(q.fairness_header, m.headers)
    FROM moved JOIN pgmb_message m ON m.id = moved.message_id
    JOIN pgmb_queue q ON q.id = moved.queue_id
    ORDER BY moved.message_id
    ON CONFLICT (message_id, queue_id) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM pg_notify('pgmb', '');
    END IF;
    RETURN n;
END $$;

-- For each of `message_ids`, a new delivery on each queue that acked it (an attempt with
-- outcome 'ack'), only queues named in `queue_names` when given, with the message's
-- priority, group and dependencies. A queue where the message is live (a delivery) or dead
-- (a dead letter) right now is skipped: the unique (message, queue) constraints allow one of
-- each, and requeueing is for dead letters. Ids of purged messages, of unknown messages and
-- of deleted queues give nothing, nor does a message claimed by an archive run: the shared
-- lock waits for a claim batch in progress to commit; each statement of this function then
-- reads the database anew (READ COMMITTED), so a message is either claimed (and skipped
-- here) or has its new delivery before a claim looks at it (and is not claimed). Returns how
-- many deliveries were created.
CREATE OR REPLACE FUNCTION pgmb.replay(message_ids uuid[], queue_names text[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(pgmb.archive_lock_key('claim'));
    INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at, created_at,
                               priority, group_key, depends_on, dependents, fair_key)
    SELECT acked.message_id, acked.queue_id, 'ready', 0, now(), now(),
           m.priority, m.group_key, m.depends_on, pgmb.has_dependents(m.id),
           pgmb.delivery_fair_key(q.fairness_header, m.headers)
    FROM (
        SELECT DISTINCT a.message_id, a.queue_id
        FROM pgmb_attempt a
        WHERE a.message_id = ANY (message_ids) AND a.outcome = 'ack'
    ) AS acked
    JOIN pgmb_message m ON m.id = acked.message_id
    JOIN pgmb_queue q ON q.id = acked.queue_id
    WHERE (queue_names IS NULL OR q.name = ANY (queue_names))
      AND NOT EXISTS (SELECT FROM pgmb_dead_letter x
                      WHERE x.message_id = acked.message_id AND x.queue_id = acked.queue_id)
      AND NOT EXISTS (SELECT FROM pgmb_archive_item i WHERE i.message_id = acked.message_id)
    ORDER BY acked.message_id, acked.queue_id
    ON CONFLICT (message_id, queue_id) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM pg_notify('pgmb', '');
    END IF;
    RETURN n;
END $$;

-- ==== Expiry ====
-- A message's expiry (pgmb_message.expires_at, from Python's ttl= or expires_at=, or the
-- new pgmb.send overload) and a queue's message_ttl and on_expiry (the columns are Django's,
-- added before this file runs, with the routing trigger that copies the earlier expiry to
-- each delivery): claims and reads skip an expired delivery, pgmb.expire dead-letters or
-- drops it (docs/decisions/0083-expiry.md). No function 0.1.1's dispatchers call changes
-- its arguments or results; a delivery without an expiry (every one 0.1.1 publishes) is
-- claimed as before.

-- Expiry (docs/delivery.md, Expiry): a queue's message_ttl, when set, is a positive number of
-- seconds and at most 30 days as its other durations; an expired delivery is dead-lettered
-- or dropped (pgmb.expire).
ALTER TABLE pgmb_queue
    ADD CONSTRAINT pgmb_queue_message_ttl_valid
        CHECK (message_ttl > 0 AND message_ttl <= 2592000),
    ADD CONSTRAINT pgmb_queue_on_expiry_valid
        CHECK (on_expiry::text = ANY ('{dead_letter,drop}'::text[]));

-- Deliveries that expire, by their expiry (pgmb.expire's sweep); rows without one, most,
-- are not in it and cost no publish anything.
CREATE INDEX IF NOT EXISTS pgmb_delivery_expiry ON pgmb_delivery (expires_at)
    WHERE expires_at IS NOT NULL;

-- Why a message's expiry is refused, or NULL: the rule of pgmb.options.check_expiry in
-- Python (tests/rules, one table of cases for both). A ttl (seconds from publication) or an
-- expires_at, not both; a ttl positive, finite and ending before the year 10000; an
-- expires_at a time pgmb stores (pgmb.valid_time). A time already past is accepted: the
-- message expires at once (docs/decisions/0083-expiry.md).
CREATE OR REPLACE FUNCTION pgmb.expiry_problem(ttl float8, expires_at timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN ttl IS NOT NULL AND expires_at IS NOT NULL
            THEN 'give a message a ttl or an expires_at, not both'
        WHEN ttl = 'NaN'::float8 OR ttl IN ('Infinity'::float8, '-Infinity'::float8) OR ttl <= 0
            THEN format('invalid ttl %s: it must be a positive, finite number of seconds', ttl)
        WHEN ttl >= extract(epoch FROM timestamptz '10000-01-01 00:00:00+00' - now())::float8
            THEN format('invalid ttl %s: too long (past the year 9999)', ttl)
        WHEN NOT pgmb.valid_time(expires_at)
            THEN format('invalid expires_at %s: a time must be finite, from the year 1 to the year 9999 (UTC)', expires_at)
    END
$$;

-- The refusal of a message whose expires_at pgmb.valid_time rejects (an infinite one would
-- never expire, as NULL, but no Python client could read the row), raised as a CHECK
-- violation of pgmb_message_times_valid as pgmb.refuse_times does; nothing otherwise.
-- Called by pgmb.admit_message and, for an UPDATE, by the check_message_times trigger.
CREATE OR REPLACE FUNCTION pgmb.refuse_expiry(m pgmb_message) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF m.expires_at IS NOT NULL AND NOT pgmb.valid_time(m.expires_at) THEN
        RAISE EXCEPTION 'message % refused by pgmb_message_times_valid: expires_at % is not a time pgmb stores (finite, from the year 1 to the year 9999, UTC)',
                        m.id, m.expires_at
            USING ERRCODE = 'check_violation', TABLE = 'pgmb_message',
                  CONSTRAINT = 'pgmb_message_times_valid';
    END IF;
END $$;

-- Before each message with options, or with times pgmb.valid_time rejects, is stored (the
-- admit_message trigger's WHEN): refuses such times (pgmb.refuse_times), enforces the options rule (as the check pgmb_message_options_valid,
-- with that name), refuses unknown dependencies (to a caller that may read messages; to
-- any other, a dependency on a message it did not publish counts as settled and is left
-- out, so that it cannot probe for ids: docs/decisions/0055-dependencies-on-own-messages.md),
-- and returns NULL (the row is not stored)
-- for a message that duplicates one for every queue its routing key matches
-- (pgmb.duplicated; the candidate queues found by their tags). A message that
-- duplicates for some of its queues only is stored, and the routing trigger leaves those
-- queues out. Rows published earlier in the same statement are visible here. Last, a
-- message with a unique key or an on_duplicate gets pgmb.admit_unique's decision.
CREATE OR REPLACE FUNCTION pgmb.admit_message(m pgmb_message) RETURNS pgmb_message
LANGUAGE plpgsql AS $$
DECLARE
    missing uuid;
    created timestamptz := coalesce(m.created_at, now());
    problem text := pgmb.message_options_problem(m.id, m.priority, m.group_key, m.depends_on,
                                                 m.dedup_id, m.max_retries, m.retry_delay);
BEGIN
    -- Its times (the trigger's WHEN lets in a message without options for them).
    IF NOT (pgmb.valid_time(m.created_at) AND pgmb.valid_time(m.available_at)) THEN
        PERFORM pgmb.refuse_times('pgmb_message', m.id::text, m.created_at, m.available_at);
    END IF;
    PERFORM pgmb.refuse_expiry(m);
    -- The options rule, reported as a check violation of pgmb_message_options_valid.
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'message % refused by pgmb_message_options_valid: %', m.id, problem
            USING ERRCODE = 'check_violation', CONSTRAINT = 'pgmb_message_options_valid';
    END IF;
    IF m.depends_on IS NOT NULL AND NOT pgmb.caller_sees_messages() THEN
        -- Whether another role's message exists, or is pending, is not this caller's to
        -- learn: its message waits only for its own (a role's messages carry its name).
        m.depends_on := nullif(ARRAY(SELECT dep FROM unnest(m.depends_on) AS dep
                                     WHERE EXISTS (SELECT FROM pgmb_message x
                                                   WHERE x.id = dep AND x.producer = m.producer)), '{}');
    END IF;
    IF m.depends_on IS NOT NULL THEN
        SELECT dep INTO missing FROM unnest(m.depends_on) AS dep
        WHERE NOT EXISTS (SELECT FROM pgmb_message x WHERE x.id = dep) LIMIT 1;
        -- Only to a caller that may read messages: to any other, a dependency that does not
        -- exist is one that was settled and archived, so that it cannot probe for ids
        -- (docs/decisions/0039-refusals-tell-nothing.md).
        IF FOUND AND pgmb.caller_sees_messages() THEN
            RAISE EXCEPTION 'message % depends on message %, which does not exist', m.id, missing
                USING ERRCODE = 'foreign_key_violation',
                      HINT = 'Publish the messages it depends on first (earlier in the same batch is fine).';
        END IF;
    END IF;
    IF m.dedup_id IS NOT NULL THEN
        -- Concurrent publishers of one dedup id take turns; the second sees the first.
        PERFORM pg_advisory_xact_lock(hashtextextended('pgmb dedup ' || m.dedup_id, 0));
        IF EXISTS (SELECT FROM pgmb_queue q
                   WHERE q.binding_tags <@ pgmb.key_tags(m.routing_key) AND ('.' || m.routing_key) ~ q.pattern)
           AND NOT EXISTS (SELECT FROM pgmb_queue q
                           WHERE q.binding_tags <@ pgmb.key_tags(m.routing_key) AND ('.' || m.routing_key) ~ q.pattern
                             AND NOT EXISTS (SELECT FROM pgmb.duplicated(q.dedup_window, q.pattern, m.id,
                                                                         m.dedup_id, created, m.producer))) THEN
            RETURN NULL;
        END IF;
    END IF;
    IF m.unique_key IS NOT NULL OR m.on_duplicate IS NOT NULL THEN
        RETURN pgmb.admit_unique(m);
    END IF;
    RETURN m;
END $$;

-- pgmb.send with an expiry (docs/delivery.md, Expiry): ttl, seconds from now, or expires_at,
-- a time (one of the two, or neither: NULL), then the options of the pgmb.send above. A
-- delivery not posted (or read) by then expires, as by its queue's message_ttl (the earlier
-- of the two holds). ttl has no default, so that a call of the form above never reaches this
-- one (a sixth argument of type integer, a priority, matches that form exactly): name it,
-- `pgmb.send(id, key, body, headers, NULL, ttl => 30)` or `..., ttl => NULL, expires_at =>
-- '2030-01-01Z')`. The same body as above, with the
-- expiry's rule and column: one more call in the plain form's path would cost every publish.
CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb, delay timestamp with time zone, ttl double precision, expires_at timestamp with time zone DEFAULT NULL::timestamp with time zone, priority integer DEFAULT 0, group_key text DEFAULT NULL::text, depends_on uuid[] DEFAULT NULL::uuid[], dedup_id text DEFAULT NULL::text, max_retries integer DEFAULT NULL::integer, retry_delay double precision DEFAULT NULL::double precision) RETURNS uuid
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
DECLARE
    stored uuid;
    expiry text := pgmb.expiry_problem(send.ttl, send.expires_at);
BEGIN
    -- Access control (access.sql): the inlined test first, pgmb.require only to refuse with its
    -- message (two SECURITY DEFINER calls cost more than the rest of the checks).
    IF NOT pgmb.may_publish() THEN
        PERFORM pgmb.require('publish');
    END IF;
    IF id IS NULL THEN
        RAISE EXCEPTION 'a message id is required' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass gen_random_uuid() for a new id.';
    END IF;
    -- The rule inline (a simple expression); pgmb.check_routing_key only to say what is wrong.
    IF NOT coalesce(pgmb.valid_routing_key(routing_key), false) THEN
        PERFORM pgmb.check_routing_key(routing_key);
    END IF;
    IF body IS NULL THEN
        RAISE EXCEPTION 'a message body is required (JSON null is ''null''::jsonb)'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'message headers must be a JSON object, not %', jsonb_typeof(headers)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A time outside what pgmb stores (pgmb.valid_time, inline): never due, unreadable.
    IF delay IS NOT NULL AND NOT (delay >= '0001-01-01 00:00:00+00'::timestamptz
                                  AND delay < '10000-01-01 00:00:00+00'::timestamptz) THEN
        PERFORM pgmb.check_time(delay);
    END IF;
    IF expiry IS NOT NULL THEN
        RAISE EXCEPTION '%', expiry USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Only with options: the plain calls of the shorter forms skip the call.
    IF send.priority IS DISTINCT FROM 0 OR send.group_key IS NOT NULL OR send.depends_on IS NOT NULL
       OR send.dedup_id IS NOT NULL OR send.max_retries IS NOT NULL OR send.retry_delay IS NOT NULL THEN
        PERFORM pgmb.check_message_options(send.id, send.priority, send.group_key, send.depends_on,
                                           send.dedup_id, send.max_retries, send.retry_delay);
    END IF;
    INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at, priority,
                              group_key, depends_on, dedup_id, max_retries, retry_delay, expires_at)
    VALUES (send.id, send.routing_key, send.body, coalesce(send.headers, '{}'), now(),
            greatest(coalesce(send.delay, now()), now()), send.priority, send.group_key,
            send.depends_on, send.dedup_id, send.max_retries, send.retry_delay,
            coalesce(send.expires_at, now() + send.ttl * interval '1 second'))
    -- A taken id is found by the insert itself: no probe of the key before it. No row comes
    -- back for a taken id or for a duplicate that pgmb.admit_message dropped.
    ON CONFLICT ON CONSTRAINT pgmb_message_pkey DO NOTHING
    RETURNING pgmb_message.id INTO stored;
    IF stored IS NOT NULL THEN
        RETURN stored;
    END IF;
    -- Nothing stored: the id is taken, or the message duplicates one for every queue. A
    -- caller that may not read messages is told neither, nor another message's id: it gets
    -- the id it sent, as if stored, and a resent message is not stored twice
    -- (docs/decisions/0039-refusals-tell-nothing.md).
    IF NOT pgmb.caller_sees_messages() THEN
        RETURN send.id;
    END IF;
    IF EXISTS (SELECT 1 FROM pgmb_message m WHERE m.id = send.id) THEN
        RAISE EXCEPTION 'message % already exists', send.id
            USING ERRCODE = 'unique_violation',
                  HINT = 'Message ids are unique; pass gen_random_uuid() for a new message.';
    END IF;
    RETURN pgmb.deduplicated(send.dedup_id, send.routing_key);
END $$;

SELECT pgmb.pin_definers(ARRAY[
    'pgmb.send(uuid, text, jsonb, jsonb, timestamptz, float8, timestamptz, integer, text, uuid[], text, integer, float8)'
]);
-- The producer API, open as the other pgmb.send forms (it checks pgmb_producer, access.sql),
-- its grants in the order a new install gives them (PUBLIC's, then pgmb_admin's).
DO $$
DECLARE
    f constant text := 'pgmb.send(uuid, text, jsonb, jsonb, timestamptz, float8, timestamptz, integer, text, uuid[], text, integer, float8)';
BEGIN
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgmb_admin') THEN
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM pgmb_admin', f);
    END IF;
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f);
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgmb_admin') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO pgmb_admin', f);
    END IF;
END $$;
-- The rule and the sweep, closed as every function of pgmb's but the reviewed list.

-- Deliveries whose time to live ran out before they were posted or read (ready, delayed or
-- waiting; a leased one, or a pull queue's message read and not yet visible again, is left
-- to its outcome, and expires here if that is a retry or it becomes visible again):
-- deleted, and dead-lettered with an error that says so unless their queue drops expired
-- messages (on_expiry 'drop'). Each writes a history row with outcome 'ttl' (no request was
-- made; the dashboard's "expired (TTL)"). Their removal releases the deliveries waiting
-- behind them, as an ack or a dead letter does (the AFTER DELETE trigger). Called where
-- pgmb.reclaim_expired is, by both dispatch paths and housekeeping; claims and reads skip
-- expired rows meanwhile. Returns how many expired.
CREATE OR REPLACE FUNCTION pgmb.expire(max_count integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    -- Each expiry is announced (pgmb.expired, events.sql) from the history's rows.
    WITH due AS (
        SELECT d.id FROM pgmb_delivery d
        WHERE d.expires_at <= clock_timestamp() AND d.state <> 'leased'
          AND NOT (d.attempts > 0 AND d.available_at > clock_timestamp()
                   AND EXISTS (SELECT FROM pgmb_queue q WHERE q.id = d.queue_id AND q.worker_id IS NULL))
        ORDER BY d.expires_at
        LIMIT max_count
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM pgmb_delivery d USING due WHERE d.id = due.id
        RETURNING d.message_id, d.queue_id, d.attempts, d.last_status,
                  format('expired: its time to live ran out at %s, before it was delivered',
                         d.expires_at) AS error
    ), buried AS (
        INSERT INTO pgmb_dead_letter (message_id, queue_id, attempts, last_status, last_error, created_at)
        SELECT g.message_id, g.queue_id, g.attempts, g.last_status, g.error, clock_timestamp()
        FROM gone g JOIN pgmb_queue q ON q.id = g.queue_id
        WHERE q.on_expiry = 'dead_letter'
        ON CONFLICT (message_id, queue_id) DO UPDATE
        SET attempts = excluded.attempts, last_status = excluded.last_status,
            last_error = excluded.last_error, created_at = excluded.created_at
        RETURNING 1
    ), history AS (
        INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
        SELECT g.message_id, g.queue_id, g.attempts, 'ttl', NULL, NULL, g.error, clock_timestamp()
        FROM gone g
        RETURNING pgmb.delivery_event('pgmb.expired', message_id, queue_id,
                                      jsonb_build_object('attempts', attempt, 'error', error))
    )
    -- Data-modifying CTEs always run to completion, read or not.
    SELECT count(*)::integer INTO n FROM history;
    RETURN n;
END $$;

REVOKE EXECUTE ON FUNCTION pgmb.expiry_problem(float8, timestamptz), pgmb.refuse_expiry(pgmb_message),
    pgmb.expire(integer) FROM PUBLIC;

-- pgmb.read acts for its caller and keeps its planner settings (both are the function's
-- own, which CREATE OR REPLACE resets; pull.sql).
SELECT pgmb.pin_definers(ARRAY['pgmb.read(text, double precision, integer, jsonb)']);
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off;

-- Per worker, over the requests of its queues (not 'unsent' or 'ttl' history rows: no
-- request was made): the last hour through the index on created_at, the last success through
-- pgmb_attempt_acked, the last error and the failures since the last success through a
-- look-back of at most 24 hours.
CREATE OR REPLACE FUNCTION pgmb.worker_metrics() RETURNS SETOF pgmb.worker_metrics
LANGUAGE sql STABLE AS $$
    SELECT w.name::text,
           w.active,
           coalesce(h.requests, 0),
           coalesce(h.successes, 0),
           h.successes::float8 / nullif(h.requests, 0),
           h.p95,
           s.at,
           e.status_code,
           e.error,
           e.created_at,
           coalesce(f.n, 0),
           now()
    FROM pgmb_worker w
    LEFT JOIN (
        SELECT q.worker_id,
               count(*) AS requests,
               count(*) FILTER (WHERE a.outcome = 'ack') AS successes,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY a.duration_ms) AS p95
        FROM pgmb_attempt a JOIN pgmb_queue q ON q.id = a.queue_id
        WHERE a.created_at > now() - interval '1 hour' AND a.outcome NOT IN ('unsent', 'ttl', 'canceled')
        GROUP BY q.worker_id
    ) h ON h.worker_id = w.id
    LEFT JOIN LATERAL (
        SELECT max(a.created_at) AS at
        FROM pgmb_queue q
        CROSS JOIN LATERAL (
            SELECT a.created_at FROM pgmb_attempt a
            WHERE a.queue_id = q.id AND a.outcome = 'ack'
            ORDER BY a.created_at DESC LIMIT 1
        ) a
        WHERE q.worker_id = w.id
    ) s ON true
    LEFT JOIN LATERAL (
        SELECT a.status_code, a.error, a.created_at
        FROM pgmb_attempt a JOIN pgmb_queue q ON q.id = a.queue_id
        WHERE q.worker_id = w.id AND a.outcome NOT IN ('ack', 'unsent', 'ttl', 'canceled')
          AND a.created_at > now() - interval '24 hours'
        ORDER BY a.created_at DESC, a.id DESC LIMIT 1
    ) e ON true
    LEFT JOIN LATERAL (
        SELECT count(*) AS n
        FROM pgmb_attempt a JOIN pgmb_queue q ON q.id = a.queue_id
        WHERE q.worker_id = w.id AND a.outcome NOT IN ('ack', 'unsent', 'ttl', 'canceled')
          AND a.created_at > greatest(s.at, now() - interval '24 hours')
    ) f ON true
    ORDER BY w.name
$$;

-- Every queue's metrics, by name. An SQL function PostgreSQL inlines: a condition on
-- queue_name reaches the scan of pgmb_queue, and each queue's deliveries are read through
-- the partial index of its ready rows (pgmb_delivery_due); leased and waiting rows (few),
-- and the last hour's attempts, are read once for all queues. 'unsent' and 'ttl' history
-- rows (no request was made) are not failures, and an archived message is neither delivered
-- nor failed.
CREATE OR REPLACE FUNCTION pgmb.metrics_all() RETURNS SETOF pgmb.queue_metrics
    LANGUAGE sql STABLE
    AS $$
    SELECT q.name::text,
           r.n + coalesce(l.n, 0) + coalesce(l.waiting, 0),
           r.due,
           extract(epoch FROM now() - greatest(r.newest, l.newest))::float8,
           extract(epoch FROM now() - r.oldest_due)::float8,
           r.n + coalesce(l.n, 0) + coalesce(l.waiting, 0) + x.n + a.n,
           coalesce(l.n, 0),
           r.retrying,
           x.n,
           coalesce(h.delivered, 0),
           coalesce(h.failed, 0),
           q.paused,
           now()
    FROM pgmb_queue q
    CROSS JOIN LATERAL (
        SELECT count(*) AS n,
               count(*) FILTER (WHERE d.available_at <= now()) AS due,
               count(*) FILTER (WHERE d.attempts > 0) AS retrying,
               max(d.created_at) AS newest,
               min(d.created_at) FILTER (WHERE d.available_at <= now()) AS oldest_due
        FROM pgmb_delivery d WHERE d.queue_id = q.id AND d.state = 'ready'
    ) r
    CROSS JOIN LATERAL (SELECT count(*) AS n FROM pgmb_dead_letter x WHERE x.queue_id = q.id) x
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM pgmb_attempt a WHERE a.queue_id = q.id AND a.outcome = 'ack'
    ) a
    LEFT JOIN (
        SELECT d.queue_id, count(*) FILTER (WHERE d.state = 'leased') AS n,
               count(*) FILTER (WHERE d.state = 'waiting') AS waiting,
               max(d.created_at) AS newest
        FROM pgmb_delivery d WHERE d.state = 'leased' OR d.state = 'waiting' GROUP BY d.queue_id
    ) l ON l.queue_id = q.id
    LEFT JOIN (
        SELECT a.queue_id,
               count(*) FILTER (WHERE a.outcome = 'ack') AS delivered,
               count(*) FILTER (WHERE a.outcome NOT IN ('ack', 'unsent', 'archived', 'ttl', 'canceled')) AS failed
        FROM pgmb_attempt a WHERE a.created_at > now() - interval '1 hour' GROUP BY a.queue_id
    ) h ON h.queue_id = q.id
    ORDER BY q.name
$$;

-- ==== Cancel and run now ====
-- Cancelling a live delivery, making one due now (docs/decisions/0084-cancel-and-run-now.md).
-- The outcome writers record a delivery cancelled in flight as 'canceled' and delete it:
-- bodies only, 0.1.1's dispatchers call them with the same arguments.

-- The error a history row of a delivery cancelled while leased (pgmb.cancel) begins with.
CREATE OR REPLACE FUNCTION pgmb.canceled_in_flight() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 'canceled while its request was in flight' $$;

-- Give leased deliveries back unattempted (a dispatcher shutting down before it posted them).
-- One cancelled while leased (pgmb.cancel) is not given back: it is deleted, recorded as
-- 'canceled' with the number its attempt would have had.
CREATE OR REPLACE FUNCTION pgmb.release(delivery_ids bigint[], lease_ids uuid[])
RETURNS integer
LANGUAGE sql AS $$
    WITH released AS (
        UPDATE pgmb_delivery d
        SET state = 'ready', lease_id = NULL, attempts = greatest(d.attempts - 1, 0), available_at = now()
        FROM unnest(delivery_ids, lease_ids) AS u(id, lease_id)
        WHERE d.id = u.id AND d.lease_id = u.lease_id AND d.state = 'leased' AND d.canceled_at IS NULL
        RETURNING 1
    ), canceled AS (
        DELETE FROM pgmb_delivery d
        USING unnest(delivery_ids, lease_ids) AS u(id, lease_id)
        WHERE d.id = u.id AND d.lease_id = u.lease_id AND d.state = 'leased' AND d.canceled_at IS NOT NULL
        RETURNING d.message_id, d.queue_id, d.attempts
    ), history AS (
        INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
        SELECT c.message_id, c.queue_id, c.attempts, 'canceled', NULL, NULL,
               pgmb.canceled_in_flight() || ': released unsent', clock_timestamp()
        FROM canceled c
        RETURNING 1
    )
    SELECT ((SELECT count(*) FROM released) + (SELECT count(*) FROM history))::integer
$$;

-- Leases that ran out (a dispatcher died or hung). One whose request started counts as a
-- failed attempt ('expired'); one that never started is handed back with its attempt
-- ('unsent', due at once), except from a delivery's third such expiry on, which counts.
-- One cancelled while leased (pgmb.cancel) goes to pgmb.settle_failures, which deletes it.
CREATE OR REPLACE FUNCTION pgmb.reclaim_expired(max_count integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    counted_ids bigint[];
    counted_leases uuid[];
    counted_errors text[];
    unsent_ids bigint[];
    unsent_lease_ids uuid[];
    returned integer := 0;
BEGIN
    SELECT array_agg(e.id) FILTER (WHERE e.counted),
           array_agg(e.lease_id) FILTER (WHERE e.counted),
           array_agg(CASE WHEN e.started OR e.unsent_leases < 2
                          THEN 'lease expired before an outcome was recorded'
                          ELSE format('lease expired before its request was marked started; counted, '
                                      'as %s earlier leases of this delivery expired so', e.unsent_leases)
                     END) FILTER (WHERE e.counted),
           array_agg(e.id) FILTER (WHERE NOT e.counted),
           array_agg(e.lease_id) FILTER (WHERE NOT e.counted)
    INTO counted_ids, counted_leases, counted_errors, unsent_ids, unsent_lease_ids
    -- At most 2 unsent leases are forgiven (docs/decisions/0006-leases-and-at-least-once.md).
    FROM (SELECT d.id, d.lease_id, d.started, d.unsent_leases,
                 d.started OR d.unsent_leases >= 2 OR d.canceled_at IS NOT NULL AS counted
          FROM pgmb_delivery d
          WHERE d.state = 'leased' AND d.available_at <= clock_timestamp()
          ORDER BY d.available_at
          LIMIT max_count
          FOR UPDATE SKIP LOCKED) AS e;
    IF unsent_ids IS NOT NULL THEN
        WITH handed_back AS (
            UPDATE pgmb_delivery d
            SET state = 'ready', lease_id = NULL, attempts = greatest(d.attempts - 1, 0),
                unsent_leases = d.unsent_leases + 1, available_at = clock_timestamp()
            FROM unnest(unsent_ids, unsent_lease_ids) AS u(id, lease_id)
            WHERE d.id = u.id AND d.lease_id = u.lease_id AND d.state = 'leased'
            RETURNING d.message_id, d.queue_id, d.attempts + 1 AS attempt
        )
        INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
        SELECT h.message_id, h.queue_id, h.attempt, 'unsent', NULL, NULL,
               'lease expired before its request was marked started: the attempt is not counted',
               clock_timestamp()
        FROM handed_back h;
        GET DIAGNOSTICS returned = ROW_COUNT;
    END IF;
    IF counted_ids IS NULL THEN
        RETURN returned;
    END IF;
    RETURN returned + pgmb.settle_failures(counted_ids, counted_leases, NULL, counted_errors,
                                           NULL, NULL, 'expired');
END $$;

-- Cancels live deliveries: one ready, delayed, retrying or waiting is deleted at once, its
-- end recorded in the history (outcome 'canceled', with the number its next attempt would
-- have had); a waiting one behind it is released as after any delete (publish.sql,
-- pgmb.release_after). One that is leased is marked (canceled_at): its request is in
-- flight, and whatever becomes of it (pgmb.ack, pgmb.settle_failures, pgmb.release,
-- pgmb.reclaim_expired) is recorded as 'canceled' and deletes it, never retried nor
-- dead-lettered. Ids that are unknown, finished or already cancelled change nothing.
-- Returns how many were deleted (`removed`) and marked (`in_flight`).
CREATE OR REPLACE FUNCTION pgmb.cancel(delivery_ids bigint[], OUT removed integer, OUT in_flight integer)
LANGUAGE plpgsql AS $$
BEGIN
    -- Locked first, in id order: a claim skips them (SKIP LOCKED), and no state changes
    -- between the two statements below.
    PERFORM FROM pgmb_delivery d WHERE d.id = ANY (delivery_ids) ORDER BY d.id FOR UPDATE;
    WITH gone AS (
        DELETE FROM pgmb_delivery d
        WHERE d.id = ANY (delivery_ids) AND d.state <> 'leased'
        RETURNING d.message_id, d.queue_id, d.attempts, d.state
    )
    INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
    SELECT g.message_id, g.queue_id, g.attempts + 1, 'canceled', NULL, NULL,
           'canceled while ' || g.state, clock_timestamp()
    FROM gone g
    ORDER BY g.message_id;
    GET DIAGNOSTICS removed = ROW_COUNT;
    UPDATE pgmb_delivery d SET canceled_at = clock_timestamp()
    WHERE d.id = ANY (delivery_ids) AND d.state = 'leased' AND d.canceled_at IS NULL;
    GET DIAGNOSTICS in_flight = ROW_COUNT;
END $$;

-- The live deliveries of a queue, all of them or those whose routing key begins with
-- `routing_key_prefix` and those created at least `older_than` ago: pgmb.cancel of their
-- ids. An unknown queue is an error.
CREATE OR REPLACE FUNCTION pgmb.cancel(queue_name text, routing_key_prefix text DEFAULT NULL,
                                       older_than interval DEFAULT NULL,
                                       OUT removed integer, OUT in_flight integer)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT c.removed, c.in_flight INTO removed, in_flight
    FROM pgmb.cancel(pgmb.matching_deliveries(queue_name, routing_key_prefix, older_than)) AS c;
END $$;

-- The ids of the live deliveries of a queue that match the filters of pgmb.cancel and
-- pgmb.run_now (NULL: any); an unknown queue is an error.
CREATE OR REPLACE FUNCTION pgmb.matching_deliveries(queue_name text, routing_key_prefix text,
                                                    older_than interval)
RETURNS bigint[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    queue uuid;
BEGIN
    SELECT q.id INTO queue FROM pgmb_queue q WHERE q.name = queue_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no queue named %', coalesce(quote_literal(queue_name), 'NULL')
            USING ERRCODE = 'undefined_object';
    END IF;
    IF older_than < interval '0' THEN
        RAISE EXCEPTION 'older_than must not be negative (got %)', older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN ARRAY(
        SELECT d.id FROM pgmb_delivery d JOIN pgmb_message m ON m.id = d.message_id
        WHERE d.queue_id = queue
          AND (routing_key_prefix IS NULL OR starts_with(m.routing_key, routing_key_prefix))
          AND (older_than IS NULL OR d.created_at <= now() - older_than)
        ORDER BY d.id);
END $$;

-- Makes live deliveries due now: one ready (delayed, or waiting for a retry's backoff) may
-- be claimed at once (`due`; the worker's rate limit and circuit breaker still apply, and a
-- paused queue stays paused); one waiting becomes due now but stays behind its group's
-- earlier member or its dependencies until they settle (`waiting`). One already due, leased
-- or unknown changes nothing. Dispatchers are woken when some became due.
CREATE OR REPLACE FUNCTION pgmb.run_now(delivery_ids bigint[], OUT due integer, OUT waiting integer)
LANGUAGE plpgsql AS $$
BEGIN
    WITH moved AS (
        UPDATE pgmb_delivery d SET available_at = now()
        WHERE d.id = ANY (delivery_ids) AND d.state IN ('ready', 'waiting') AND d.available_at > now()
        RETURNING d.state
    )
    SELECT count(*) FILTER (WHERE m.state = 'ready'), count(*) FILTER (WHERE m.state = 'waiting')
    INTO due, waiting
    FROM moved m;
    IF due > 0 THEN
        PERFORM pgmb.wake_dispatchers();
    END IF;
END $$;

-- pgmb.run_now of the live deliveries of a queue that match (as pgmb.cancel's filters).
CREATE OR REPLACE FUNCTION pgmb.run_now(queue_name text, routing_key_prefix text DEFAULT NULL,
                                        older_than interval DEFAULT NULL,
                                        OUT due integer, OUT waiting integer)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT r.due, r.waiting INTO due, waiting
    FROM pgmb.run_now(pgmb.matching_deliveries(queue_name, routing_key_prefix, older_than)) AS r;
END $$;

-- Closed, as every function of pgmb's but the reviewed list (access.sql).
REVOKE EXECUTE ON FUNCTION
    pgmb.canceled_in_flight(),
    pgmb.cancel(bigint[]),
    pgmb.cancel(text, text, interval),
    pgmb.matching_deliveries(text, text, interval),
    pgmb.run_now(bigint[]),
    pgmb.run_now(text, text, interval)
FROM PUBLIC;

-- ==== Operational events ====
-- pgmb/sql/schema/events.sql whole (the settings row, pgmb.publish_event and the dead
-- letter's event), and the functions that publish them: pgmb.settle_failures, pgmb.nack and
-- pgmb.read (dead letters), pgmb.breaker_announce (a breaker opened or closed). Their
-- arguments and results are 0.1.1's: a dispatcher of 0.1.1 calls them as before, and its
-- dead letters are announced too.

-- Operational events (docs/operations.md, Events; docs/decisions/0085-operational-events.md):
-- pgmb publishes messages of its own, under routing keys that begin with `pgmb.`, when a
-- delivery is dead-lettered (pgmb.dead_lettered), when a worker's circuit breaker opens or
-- closes (pgmb.breaker.opened, pgmb.breaker.closed) and when a delivery expires
-- (pgmb.expired). A queue bound to `pgmb.#` gets them all and can page someone. Off by
-- default.
--
-- Whether they are published is one row of pgmb.event_settings, read only where an event
-- would be published (a dead letter, a breaker's transition): the paths where nothing dies
-- read nothing more. A row, not a setting of the session: `manage.py pgmb_events on`
-- reaches the dispatchers already running, at their next statement.
--
-- Never recursive: an event about a delivery of a message whose routing key is under `pgmb.`
-- (an event's own delivery dying) is not published.
--
-- Publishing an event inserts one message, which the routing trigger routes as any other:
-- new rows of pgmb_message and pgmb_delivery, no lock on a row that exists already, so it
-- waits for no other transaction's delivery or worker rows (a settle or a claim holds those):
-- no deadlock with routing or with other dispatchers (tests/dispatch/test_events.py runs
-- several). The functions that publish run as their caller: the owner, a pgmb_admin member
-- (a dispatcher), or the owner again inside a definer (pgmb.nack of a consumer role); each
-- may insert messages.

-- The switch: one row, off until `manage.py pgmb_events on` (pgmb.set_events).
CREATE TABLE IF NOT EXISTS pgmb.event_settings (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    enabled boolean NOT NULL DEFAULT false
);
INSERT INTO pgmb.event_settings DEFAULT VALUES ON CONFLICT DO NOTHING;

-- Whether events are published.
CREATE OR REPLACE FUNCTION pgmb.events_enabled() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT s.enabled FROM pgmb.event_settings s), false)
$$;

-- Turn events on or off (`manage.py pgmb_events`); returns the new state.
CREATE OR REPLACE FUNCTION pgmb.set_events(enabled boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF enabled IS NULL THEN
        RAISE EXCEPTION 'events are on (true) or off (false), not NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    INSERT INTO pgmb.event_settings AS s (one, enabled) VALUES (true, set_events.enabled)
    ON CONFLICT (one) DO UPDATE SET enabled = excluded.enabled;
    RETURN enabled;
END $$;

-- Publish an event: a message with this routing key (under `pgmb.`) and body, routed as any
-- other. Nothing when events are off (returns NULL); else the message's id. The function the
-- other parts of pgmb call (expiry publishes pgmb.expired through it).
CREATE OR REPLACE FUNCTION pgmb.publish_event(routing_key text, body jsonb) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    id uuid;
BEGIN
    IF NOT starts_with(coalesce(routing_key, ''), 'pgmb.') THEN
        RAISE EXCEPTION 'invalid event routing key %: pgmb''s events are under pgmb.', quote_nullable(routing_key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT pgmb.events_enabled() THEN
        RETURN NULL;
    END IF;
    id := pgmb.uuid_v7();
    INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at, priority)
    VALUES (id, routing_key, coalesce(body, 'null'::jsonb), '{}', now(), now(), 0);
    RETURN id;
END $$;

-- An event about a delivery of a message on a queue (pgmb.dead_lettered, pgmb.expired):
-- body {queue, worker (NULL for a pull queue), message_id, routing_key} and `details`'
-- keys. Nothing when events are off, nor for a message whose routing key is under `pgmb.`
-- (never recursive), nor for a message or queue gone meanwhile. Returns whether one was
-- published. Expiry calls it with 'pgmb.expired'.
CREATE OR REPLACE FUNCTION pgmb.delivery_event(routing_key text, message_id uuid, queue_id uuid, details jsonb)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    body jsonb;
BEGIN
    IF NOT pgmb.events_enabled() THEN
        RETURN false;
    END IF;
    SELECT jsonb_build_object('queue', q.name, 'worker', w.name, 'message_id', m.id,
                              'routing_key', m.routing_key) || coalesce(details, '{}')
    INTO body
    FROM pgmb_message m
    JOIN pgmb_queue q ON q.id = delivery_event.queue_id
    LEFT JOIN pgmb_worker w ON w.id = q.worker_id
    WHERE m.id = delivery_event.message_id AND NOT starts_with(m.routing_key, 'pgmb.');
    IF body IS NULL THEN
        RETURN false;
    END IF;
    RETURN pgmb.publish_event(routing_key, body) IS NOT NULL;
END $$;

-- The event of a dead letter (pgmb.delivery_event's pgmb.dead_lettered, with its attempts
-- and last outcome). Called per dead letter where deliveries die (pgmb.settle_failures,
-- pgmb.nack, pgmb.read), only for those.
CREATE OR REPLACE FUNCTION pgmb.dead_letter_event(message_id uuid, queue_id uuid, attempts integer,
                                                  last_status integer, last_error text)
RETURNS boolean
LANGUAGE sql AS $$
    SELECT pgmb.delivery_event('pgmb.dead_lettered', message_id, queue_id,
                               jsonb_build_object('attempts', attempts, 'last_status', last_status,
                                                  'last_error', last_error))
$$;

CREATE OR REPLACE FUNCTION pgmb.nack(queue_name text, delivery_ids bigint[], read_counts integer[], errors text[] DEFAULT NULL::text[]) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    q record;
    settled integer;
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    PERFORM pgmb.check_pull_ids(queue_name, q.id, delivery_ids);
    IF cardinality(delivery_ids) IS DISTINCT FROM cardinality(read_counts)
       OR (errors IS NOT NULL AND cardinality(errors) <> cardinality(delivery_ids)) THEN
        RAISE EXCEPTION 'pgmb.nack needs one read count (and one error, if any) per message id (% ids, % read counts, % errors)',
                        cardinality(delivery_ids), coalesce(cardinality(read_counts), 0), coalesce(cardinality(errors), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH input AS (
        SELECT u.id, u.read_ct, left(coalesce(u.error, ''), 2000) AS error
        FROM unnest(delivery_ids, read_counts, coalesce(errors, array_fill(NULL::text, ARRAY[cardinality(delivery_ids)])))
            AS u(id, read_ct, error)
    ), target AS (
        SELECT d.id, d.message_id, d.queue_id, d.attempts, u.error,
               d.attempts >= 1 + coalesce(m.max_retries, qu.max_retries) AS exhausted,
               qu.backoff_base, qu.backoff_max, m.retry_delay
        FROM input u
        JOIN pgmb_delivery d ON d.id = u.id AND d.attempts = u.read_ct AND d.state = 'ready'
        JOIN pgmb_queue qu ON qu.id = d.queue_id AND qu.id = q.id
        JOIN pgmb_message m ON m.id = d.message_id
        FOR UPDATE OF d
    ), dead AS (
        DELETE FROM pgmb_delivery d USING target t WHERE d.id = t.id AND t.exhausted
        RETURNING d.id
    ), buried AS (
        INSERT INTO pgmb_dead_letter (message_id, queue_id, attempts, last_status, last_error, created_at)
        SELECT t.message_id, t.queue_id, t.attempts, NULL, t.error, clock_timestamp()
        FROM target t JOIN dead ON dead.id = t.id
        ON CONFLICT (message_id, queue_id) DO UPDATE
        SET attempts = excluded.attempts, last_status = excluded.last_status,
            last_error = excluded.last_error, created_at = excluded.created_at
        -- Each dead letter announced (pgmb.dead_lettered, events.sql).
        RETURNING pgmb.dead_letter_event(message_id, queue_id, attempts, last_status, last_error)
    ), retried AS (
        UPDATE pgmb_delivery d
        SET last_status = NULL, last_error = t.error,
            available_at = clock_timestamp()
                + coalesce(t.retry_delay, pgmb.retry_delay(t.attempts, t.backoff_base, t.backoff_max))
                  * interval '1 second'
        FROM target t
        WHERE d.id = t.id AND NOT t.exhausted
        RETURNING 1
    ), history AS (
        INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
        SELECT t.message_id, t.queue_id, t.attempts, CASE WHEN t.exhausted THEN 'dead' ELSE 'retry' END,
               NULL, NULL, t.error, clock_timestamp()
        FROM target t
        RETURNING 1
    )
    SELECT count(*)::integer INTO settled FROM history;
    RETURN settled;
END $$;

-- CREATE OR REPLACE reset what pull.sql sets on these two.
SELECT pgmb.pin_definers(ARRAY['pgmb.nack(text, bigint[], integer[], text[])',
                               'pgmb.read(text, double precision, integer, jsonb)']);
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off;

CREATE OR REPLACE FUNCTION pgmb.breaker_announce(worker_name text, state text, reason text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE WARNING 'pgmb: circuit breaker of worker % is %: %', worker_name, replace(state, '_', '-'), reason
        USING ERRCODE = '01PB0',
              DETAIL = json_build_object('worker', worker_name, 'state', state, 'reason', reason)::text;
    IF state = 'closed' THEN
        -- Its deliveries are claimable again: wake dispatchers that sleep (none: no cost).
        PERFORM pgmb.wake_dispatchers();
    END IF;
    -- Opening and closing are events (events.sql; nothing when they are off). Half-open is
    -- the breaker's own business: the probe's outcome opens or closes it again.
    IF state IN ('open', 'closed') THEN
        PERFORM pgmb.publish_event(CASE state WHEN 'open' THEN 'pgmb.breaker.opened' ELSE 'pgmb.breaker.closed' END,
                                   jsonb_build_object('worker', worker_name, 'state', state, 'reason', reason));
    END IF;
END $$;

-- Closed, as every function of pgmb's but the reviewed list (access.sql).
REVOKE EXECUTE ON FUNCTION
    pgmb.events_enabled(),
    pgmb.set_events(boolean),
    pgmb.publish_event(text, jsonb),
    pgmb.delivery_event(text, uuid, uuid, jsonb),
    pgmb.dead_letter_event(uuid, uuid, integer, integer, text)
FROM PUBLIC;

-- ==== Backfill and recover ====

CREATE OR REPLACE FUNCTION pgmb.check_window(action text, queue_name text, since timestamptz,
                                             until timestamptz, max_count integer)
RETURNS uuid
LANGUAGE plpgsql STABLE AS $$
DECLARE
    qid uuid;
BEGIN
    IF since IS NULL OR until IS NULL OR since IN ('-infinity', 'infinity') OR until IN ('-infinity', 'infinity') THEN
        RAISE EXCEPTION 'invalid window for %: since and until are both needed, finite times (% to %)',
                        action, coalesce(since::text, 'NULL'), coalesce(until::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF until < since THEN
        RAISE EXCEPTION 'invalid window for %: until % is before since %', action, until, since
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_count IS NULL OR max_count NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'invalid max_count % for %: 1 to 1000000 a call (call again for more)',
                        coalesce(max_count::text, 'NULL'), action
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT q.id INTO qid FROM pgmb_queue q WHERE q.name = queue_name;
    IF qid IS NULL THEN
        RAISE EXCEPTION 'queue % does not exist', quote_nullable(queue_name) USING ERRCODE = 'undefined_object';
    END IF;
    RETURN qid;
END $$;

CREATE OR REPLACE FUNCTION pgmb.backfill(queue_name text, since timestamptz, until timestamptz,
                                         max_count integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    qid uuid := pgmb.check_window('backfill', queue_name, since, until, max_count);
    q pgmb_queue;
    n integer;
BEGIN
    SELECT * INTO q FROM pgmb_queue qu WHERE qu.id = qid;
    IF NOT q.keep_history THEN
        RAISE EXCEPTION 'queue % keeps no history: a backfill could not tell what it consumed', quote_literal(q.name)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('SELECT pgmb.set_keep_history(%L, true); first.', q.name);
    END IF;
    PERFORM pg_advisory_xact_lock_shared(pgmb.archive_lock_key('claim'));
    -- As routing would have made it: its fairness key (fairness.sql) and the message's own
    -- expiry (the queue's message_ttl counts from a publication long past).
    INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at, created_at,
                               priority, group_key, depends_on, dependents, fair_key, expires_at)
    SELECT m.id, q.id, 'ready', 0, greatest(m.available_at, now()), now(),
           m.priority, m.group_key, m.depends_on, pgmb.has_dependents(m.id),
           pgmb.delivery_fair_key(q.fairness_header, m.headers), m.expires_at
    FROM pgmb_message m
    WHERE m.created_at >= since AND m.created_at < least(until, q.created_at)
      AND ('.' || m.routing_key) ~ q.pattern
      AND NOT EXISTS (SELECT FROM pgmb_delivery d WHERE d.message_id = m.id AND d.queue_id = q.id)
      AND NOT EXISTS (SELECT FROM pgmb_dead_letter x WHERE x.message_id = m.id AND x.queue_id = q.id)
      AND NOT EXISTS (SELECT FROM pgmb_attempt a WHERE a.message_id = m.id AND a.queue_id = q.id)
      AND NOT EXISTS (SELECT FROM pgmb_archive_item i WHERE i.message_id = m.id)
    ORDER BY m.created_at, m.id
    LIMIT max_count
    ON CONFLICT (message_id, queue_id) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM pg_notify('pgmb', '');
    END IF;
    RETURN n;
END $$;

CREATE OR REPLACE FUNCTION pgmb.recover(queue_name text, since timestamptz, until timestamptz DEFAULT now(),
                                        max_count integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    qid uuid := pgmb.check_window('recover', queue_name, since, until, max_count);
BEGIN
    PERFORM pg_advisory_xact_lock_shared(pgmb.archive_lock_key('claim'));
    RETURN pgmb.requeue(ARRAY(
        SELECT x.id FROM pgmb_dead_letter x
        WHERE x.queue_id = qid AND x.created_at >= since AND x.created_at < until
        ORDER BY x.created_at, x.id
        LIMIT max_count));
END $$;

-- Closed, as every function of pgmb's but the reviewed list (access.sql).
REVOKE EXECUTE ON FUNCTION
    pgmb.check_window(text, text, timestamptz, timestamptz, integer),
    pgmb.backfill(text, timestamptz, timestamptz, integer),
    pgmb.recover(text, timestamptz, timestamptz, integer)
FROM PUBLIC;

-- ==== Schedules ====
-- Schedules (docs/decisions/0089-schedules-fired-by-the-loops.md): pgmb_schedule is made by
-- the Django operation before this; here its functions (schedules.sql whole), the next
-- schedule counted by pgmb.next_wakeup (only one still to come: an overdue schedule wakes
-- no 0.1.1 dispatcher, which does not fire it) and the in-database loop's step that fires
-- them (pgmb.dispatch_loop, its arguments unchanged).

-- Schedules (docs/schedules.md, docs/decisions/0089-schedules-fired-by-the-loops.md): a row
-- of pgmb_schedule publishes its message at each due time of a cron expression (5 fields,
-- in a time zone) or of a fixed interval. Whichever loop runs fires it, the external
-- dispatchers or the in-database loop, through pgmb.fire_due_schedules: due rows locked FOR
-- UPDATE SKIP LOCKED, each due time's message published through pgmb.send with an id
-- derived from (schedule, due time), and the row advanced in the same transaction. So a due
-- time is fired once whatever runs, and a crash before the commit fires it again, never twice.

-- ---------------------------------------------------------------------------------------
-- The cron rule. Python reads cron expressions with cronsim (pgmb/schedules.py); the
-- in-database loop must compute a next due time without Python, so the same rule is here:
-- cronsim's algorithm for 5-field expressions, step for step, and tests/rules/test_cron.py
-- runs one table of cases (DST edges included) and a sweep of generated expressions
-- through both. What cronsim accepts beyond this (L, W, #, 6 fields) both refuse.
-- ---------------------------------------------------------------------------------------

-- The message of a bad expression, the same words as pgmb/schedules.py's.
CREATE OR REPLACE FUNCTION pgmb.cron_refuse(expr text, detail text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION 'bad cron expression "%": %', expr, detail
        USING ERRCODE = 'invalid_parameter_value',
              HINT = 'Five fields: minute hour day-of-month month day-of-week (numbers, *, ranges, steps, lists, JAN-DEC, SUN-SAT).';
END $$;

-- One number (or a month or day name) of field `field` (1 minute, 2 hour, 3 day of the month,
-- 4 month, 5 day of the week), as cronsim reads it: digits only, within the field's range.
CREATE OR REPLACE FUNCTION pgmb.cron_number(expr text, s text, field integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v integer;
BEGIN
    IF field = 4 AND s = ANY ('{JAN,FEB,MAR,APR,MAY,JUN,JUL,AUG,SEP,OCT,NOV,DEC}') THEN
        RETURN array_position('{JAN,FEB,MAR,APR,MAY,JUN,JUL,AUG,SEP,OCT,NOV,DEC}'::text[], s);
    END IF;
    IF field = 5 AND s = ANY ('{SUN,MON,TUE,WED,THU,FRI,SAT}') THEN
        RETURN array_position('{SUN,MON,TUE,WED,THU,FRI,SAT}'::text[], s) - 1;
    END IF;
    -- Past 9 digits out of every range anyway (and of integer's).
    IF s !~ '^[0-9]{1,9}$' THEN
        PERFORM pgmb.cron_refuse(expr, 'bad ' || (ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'])[field]);
    END IF;
    v := s::integer;
    IF v < (ARRAY[0, 0, 1, 1, 0])[field] OR v > (ARRAY[59, 23, 31, 12, 7])[field] THEN
        PERFORM pgmb.cron_refuse(expr, 'bad ' || (ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'])[field]);
    END IF;
    RETURN v;
END $$;

-- The values field `field`'s text `s` allows, sorted: cronsim's Field.parse (a list is read
-- first, then a step, then a range; a step over one value runs to the field's end).
CREATE OR REPLACE FUNCTION pgmb.cron_field(expr text, s text, field integer) RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    lo integer := (ARRAY[0, 0, 1, 1, 0])[field];
    hi integer := (ARRAY[59, 23, 31, 12, 7])[field];
    items integer[] := '{}';
    term text;
    step_text text;
    step integer;
    a integer;
    b integer;
BEGIN
    IF s = '*' THEN
        RETURN ARRAY(SELECT generate_series(lo, hi));
    END IF;
    IF strpos(s, ',') > 0 THEN
        FOREACH term IN ARRAY string_to_array(s, ',') LOOP
            items := items || pgmb.cron_field(expr, term, field);
        END LOOP;
        RETURN ARRAY(SELECT DISTINCT x FROM unnest(items) AS x ORDER BY x);
    END IF;
    IF strpos(s, '/') > 0 THEN
        term := split_part(s, '/', 1);
        step_text := substring(s FROM strpos(s, '/') + 1);
        IF step_text !~ '^[0-9]+$' OR step_text ~ '^0+$' THEN
            PERFORM pgmb.cron_refuse(expr, 'bad ' || (ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'])[field]);
        END IF;
        -- A step past every range picks one value, as any step over 60 does.
        step := CASE WHEN length(step_text) > 9 THEN 1000000000 ELSE step_text::integer END;
        items := pgmb.cron_field(expr, term, field);
        IF cardinality(items) = 1 THEN
            RETURN ARRAY(SELECT generate_series(items[1], hi, step));
        END IF;
        RETURN ARRAY(SELECT x FROM unnest(items) WITH ORDINALITY AS u(x, n) WHERE (n - 1) % step = 0 ORDER BY n);
    END IF;
    IF strpos(s, '-') > 0 THEN
        a := pgmb.cron_number(expr, split_part(s, '-', 1), field);
        b := pgmb.cron_number(expr, substring(s FROM strpos(s, '-') + 1), field);
        IF b < a THEN
            PERFORM pgmb.cron_refuse(expr, 'bad ' || (ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'])[field]);
        END IF;
        RETURN ARRAY(SELECT generate_series(a, b));
    END IF;
    RETURN ARRAY[pgmb.cron_number(expr, s, field)];
END $$;

-- A cron expression read: each field's values, whether the day of the month AND the day of
-- the week must both match (either field starting with '*', as Debian cron and cronsim
-- read it; otherwise either one matches), and whether the next due time is found in wall
-- time (`wall`: minute and hour both fixed, cronsim's Debian-style handling of DST) or in
-- real time. Refuses what pgmb/schedules.py refuses, with the same words, in the same order.
CREATE OR REPLACE FUNCTION pgmb.cron_fields(expr text, OUT minutes integer[], OUT hours integer[],
                                            OUT days integer[], OUT months integer[], OUT weekdays integer[],
                                            OUT day_and boolean, OUT wall boolean)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    trimmed text := regexp_replace(upper(coalesce(expr, '')), '^\s+|\s+$', '', 'g');
    parts text[] := CASE WHEN trimmed = '' THEN '{}'::text[] ELSE regexp_split_to_array(trimmed, '\s+') END;
BEGIN
    IF cardinality(parts) <> 5 THEN
        PERFORM pgmb.cron_refuse(expr, format('expected 5 fields (minute hour day-of-month month day-of-week), got %s',
                                              cardinality(parts)));
    END IF;
    IF strpos(parts[3], 'L') > 0 OR strpos(parts[3], 'W') > 0 OR strpos(parts[5], 'L') > 0
       OR strpos(parts[5], '#') > 0 THEN
        PERFORM pgmb.cron_refuse(expr, 'L, W and # are not supported');
    END IF;
    minutes := pgmb.cron_field(expr, parts[1], 1);
    hours := pgmb.cron_field(expr, parts[2], 2);
    days := pgmb.cron_field(expr, parts[3], 3);
    months := pgmb.cron_field(expr, parts[4], 4);
    weekdays := pgmb.cron_field(expr, parts[5], 5);
    day_and := left(parts[3], 1) = '*' OR left(parts[5], 1) = '*';
    -- Days that no month chosen has, when they must match: never due.
    IF day_and AND days[1] > 29
       AND days[1] > (SELECT max((ARRAY[31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[m]) FROM unnest(months) AS m) THEN
        PERFORM pgmb.cron_refuse(expr, 'bad day-of-month');
    END IF;
    wall := left(parts[1], 1) <> '*' AND left(parts[2], 1) <> '*';
END $$;

-- Refuses a time zone that is not an IANA name PostgreSQL knows (the same test as Python's
-- zoneinfo, where both have the zone): "Europe/Berlin", "UTC"; no offsets or POSIX rules.
CREATE OR REPLACE FUNCTION pgmb.check_time_zone(tz text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF tz IS NULL OR tz !~ '^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$'
       OR NOT EXISTS (SELECT FROM pg_timezone_names WHERE name = tz) THEN
        RAISE EXCEPTION 'unknown time zone "%"', tz USING ERRCODE = 'invalid_parameter_value',
            HINT = 'An IANA time zone name, such as UTC or Europe/Berlin.';
    END IF;
    RETURN tz;
END $$;

-- The first instant whose wall time in `tz` is `w` (of two in an hour the clocks go back
-- over: the first, Python's fold=0), or NULL for a wall time the zone skips. The zone's
-- offsets a day either side are the candidates: clocks change at most once in a day.
CREATE OR REPLACE FUNCTION pgmb.wall_instant(w timestamp, tz text) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(c) FROM (
        SELECT (w AT TIME ZONE 'UTC') - ((u AT TIME ZONE tz) - (u AT TIME ZONE 'UTC')) AS c
        FROM (VALUES ((w AT TIME ZONE 'UTC') - interval '1 day'), ((w AT TIME ZONE 'UTC') + interval '1 day')) AS v(u)
    ) AS candidates
    WHERE c AT TIME ZONE tz = w
$$;

-- The first due time of cron expression `expr` in time zone `tz` after `after` (to the
-- second): cronsim's CronSim(expr, after in tz) and next(), step for step. With minute and
-- hour fixed the search runs in wall time, and a due time the clocks skip moves to the first
-- wall minute that exists (02:30 on the spring-forward day is 03:00), one they repeat is
-- taken once, the first time; otherwise it runs in real time (ticks in UTC seconds), so
-- "0 * * * *" is due every real hour. Zones whose clocks change at midnight or by less than
-- whole minutes may differ from cronsim; the tested ones (UTC, Europe/Berlin) do not.
CREATE OR REPLACE FUNCTION pgmb.cron_next(expr text, tz text, after timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    f record;
    -- Wall-time search: w; real-time search: t. cur is the wall time looked at.
    w timestamp;
    t timestamptz;
    cur timestamp;
    needle date;
    start_year integer;
    delta integer;
    result timestamptz;
BEGIN
    f := pgmb.cron_fields(expr);
    PERFORM pgmb.check_time_zone(tz);
    IF after IS NULL THEN
        RAISE EXCEPTION 'a time to start from is required' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- Microseconds dropped, then one second on (cronsim's first tick).
    IF f.wall THEN
        w := date_trunc('second', after AT TIME ZONE tz) + interval '1 second';
        cur := w;
    ELSE
        t := date_trunc('second', after AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '1 second';
        cur := t AT TIME ZONE tz;
    END IF;
    start_year := extract(year FROM cur);
    LOOP
        -- The month: the first day of the next allowed one, at midnight.
        IF NOT extract(month FROM cur)::integer = ANY (f.months) THEN
            needle := (date_trunc('month', cur) + interval '1 month')::date;
            WHILE NOT extract(month FROM needle)::integer = ANY (f.months) LOOP
                needle := (needle + interval '1 month')::date;
            END LOOP;
            IF f.wall THEN w := needle; ELSE t := coalesce(pgmb.wall_instant(needle, tz), needle AT TIME ZONE tz); END IF;
            cur := CASE WHEN f.wall THEN w ELSE t AT TIME ZONE tz END;
        END IF;
        IF extract(year FROM cur) > start_year + 50 THEN
            PERFORM pgmb.cron_refuse(expr, 'no due time within 50 years');
        END IF;
        -- The day: on to one that matches, or to the first of the next month (checked again).
        needle := cur::date;
        IF NOT pgmb.cron_day_matches(needle, f.days, f.weekdays, f.day_and) THEN
            LOOP
                needle := needle + 1;
                EXIT WHEN pgmb.cron_day_matches(needle, f.days, f.weekdays, f.day_and) OR extract(day FROM needle) = 1;
            END LOOP;
            IF f.wall THEN w := needle; ELSE t := coalesce(pgmb.wall_instant(needle, tz), needle AT TIME ZONE tz); END IF;
            cur := CASE WHEN f.wall THEN w ELSE t AT TIME ZONE tz END;
            CONTINUE;
        END IF;
        -- The hour: from its start, an hour at a time, to a match or midnight.
        IF NOT extract(hour FROM cur)::integer = ANY (f.hours) THEN
            delta := extract(minute FROM cur)::integer * 60 + floor(extract(second FROM cur))::integer;
            IF f.wall THEN w := w - delta * interval '1 second'; ELSE t := t - delta * interval '1 second'; END IF;
            LOOP
                IF f.wall THEN w := w + interval '1 hour'; cur := w;
                ELSE t := t + interval '1 hour'; cur := t AT TIME ZONE tz; END IF;
                EXIT WHEN extract(hour FROM cur)::integer = ANY (f.hours) OR extract(hour FROM cur) = 0;
            END LOOP;
            CONTINUE;
        END IF;
        -- The minute: from its start; one allowed minute is jumped to, several stepped to.
        IF NOT extract(minute FROM cur)::integer = ANY (f.minutes) THEN
            delta := floor(extract(second FROM cur))::integer;
            IF cardinality(f.minutes) = 1 THEN
                delta := delta - ((f.minutes[1] - extract(minute FROM cur)::integer + 60) % 60) * 60;
            END IF;
            IF f.wall THEN w := w - delta * interval '1 second'; cur := w;
            ELSE t := t - delta * interval '1 second'; cur := t AT TIME ZONE tz; END IF;
            WHILE NOT extract(minute FROM cur)::integer = ANY (f.minutes) LOOP
                IF f.wall THEN w := w + interval '1 minute'; cur := w;
                ELSE t := t + interval '1 minute'; cur := t AT TIME ZONE tz; END IF;
                EXIT WHEN extract(minute FROM cur) = 0;
            END LOOP;
            CONTINUE;
        END IF;
        -- The second: always 0 in 5 fields.
        IF floor(extract(second FROM cur)) <> 0 THEN
            delta := (60 - floor(extract(second FROM cur))::integer) % 60;
            IF f.wall THEN w := w + delta * interval '1 second'; cur := w;
            ELSE t := t + delta * interval '1 second'; cur := t AT TIME ZONE tz; END IF;
            CONTINUE;
        END IF;
        EXIT;
    END LOOP;
    IF NOT f.wall THEN
        RETURN t;
    END IF;
    -- A wall time the clocks skip: on a minute at a time to one that exists.
    LOOP
        result := pgmb.wall_instant(w, tz);
        EXIT WHEN result IS NOT NULL;
        w := w + interval '1 minute';
    END LOOP;
    RETURN result;
END $$;

-- Whether day `d` matches: its day of the month and its day of the week (0 or 7 Sunday)
-- both, or either one (day_and false).
CREATE OR REPLACE FUNCTION pgmb.cron_day_matches(d date, days integer[], weekdays integer[], day_and boolean)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN day_and THEN dom AND dow ELSE dom OR dow END
    FROM (SELECT extract(day FROM d)::integer = ANY (days) AS dom,
                 (extract(isodow FROM d)::integer = ANY (weekdays)
                  OR extract(isodow FROM d)::integer % 7 = ANY (weekdays)) AS dow) AS m
$$;

-- ---------------------------------------------------------------------------------------
-- Due times and message ids
-- ---------------------------------------------------------------------------------------

-- The first due time of schedule `s` after `t`: for an interval, in the series of `due`
-- (a due time of s) and due ± n intervals; for cron, pgmb.cron_next.
CREATE OR REPLACE FUNCTION pgmb.schedule_after(s pgmb_schedule, due timestamptz, t timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    step numeric;
BEGIN
    IF s.cron IS NOT NULL THEN
        RETURN pgmb.cron_next(s.cron, s.timezone, t);
    END IF;
    step := extract(epoch FROM s.every);
    RETURN due + (floor(extract(epoch FROM t - due) / step) + 1) * step * interval '1 second';
END $$;

-- The id of the message schedule `schedule_id` publishes for due time `due`: a UUID version
-- 8 whose first 48 bits are the due time's Unix milliseconds (so it sorts, and lands in a
-- day's history partition, as a UUID v7 of that time) and whose other bits come from an
-- MD5 of (schedule, due time). The same due time always gives the same id: a fire that
-- ran again could not store its message twice. pgmb/schedules.py computes the same.
CREATE OR REPLACE FUNCTION pgmb.schedule_message_id(schedule_id bigint, due timestamptz) RETURNS uuid
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    ms bigint := floor(extract(epoch FROM due) * 1000);
    b bytea := substring(int8send(ms) FROM 3)
               || substring(decode(md5(format('pgmb schedule %s %s', schedule_id, ms)), 'hex') FROM 7 FOR 10);
BEGIN
    b := set_byte(b, 6, (get_byte(b, 6) & 15) | 128);   -- version 8
    b := set_byte(b, 8, (get_byte(b, 8) & 63) | 128);   -- RFC 9562 variant
    RETURN encode(b, 'hex')::uuid;
END $$;

-- ---------------------------------------------------------------------------------------
-- The SQL API: schedule, pause, resume, unschedule
-- ---------------------------------------------------------------------------------------

-- Creates schedule `name`, or changes it: its message (routing key, body, headers) and when
-- (a cron expression in a time zone, or an interval of at least 1 second), what to do with
-- runs missed while nothing fired (missed: 'skip', 'once' or 'all') and, optionally, its
-- first due time (otherwise the cron's next, or now + the interval). Changing a schedule
-- keeps its next due time unless its cron, interval, time zone or first_run change. With
-- `task` (pgmb.tasks.schedule_task: {"backend", "task_path", "queue_name", "priority",
-- "args", "kwargs"}), each run enqueues that Django task (pgmb.enqueue_task: its message and
-- its READY result row) instead of publishing a plain message.
-- Returns the schedule's id. Checks everything first: bad input stores nothing.
CREATE OR REPLACE FUNCTION pgmb.schedule(name text, routing_key text, body jsonb, headers jsonb DEFAULT NULL,
                                         cron text DEFAULT NULL, every interval DEFAULT NULL,
                                         timezone text DEFAULT 'UTC', missed text DEFAULT 'once',
                                         first_run timestamptz DEFAULT NULL, task jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    problem text;
    first timestamptz;
    schedule_id bigint;
BEGIN
    IF name IS NULL OR btrim(name) = '' OR length(name) > 200 THEN
        RAISE EXCEPTION 'a schedule needs a name (1 to 200 characters)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (cron IS NULL) = (every IS NULL) THEN
        RAISE EXCEPTION 'schedule "%": give either cron or every, not both or neither', name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF every IS NOT NULL THEN
        IF extract(epoch FROM every) < 1 THEN
            RAISE EXCEPTION 'schedule "%": an interval of at least 1 second, not %', name, every
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- Fixed length: a month is 30 days, as the interval's epoch counts it.
        every := make_interval(secs => extract(epoch FROM every));
    END IF;
    PERFORM pgmb.check_time_zone(timezone);
    IF cron IS NOT NULL THEN
        PERFORM pgmb.cron_fields(cron);
    END IF;
    IF task IS NOT NULL AND (jsonb_typeof(task) <> 'object' OR NOT task ?& ARRAY['backend', 'task_path', 'queue_name']) THEN
        RAISE EXCEPTION 'schedule "%": a task is an object with backend, task_path and queue_name', name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF missed IS NULL OR missed NOT IN ('skip', 'once', 'all') THEN
        RAISE EXCEPTION 'schedule "%": missed is skip, once or all, not %', name, coalesce(missed, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pgmb.check_routing_key(routing_key);
    IF body IS NULL THEN
        RAISE EXCEPTION 'a message body is required (JSON null is ''null''::jsonb)' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- A message's headers are an object (pgmb_message's CHECK): refused here, not at each fire.
    IF jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'schedule "%": the headers are a JSON object, not %', name, jsonb_typeof(headers)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    problem := pgmb.message_problem(body, coalesce(headers, '{}'));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'schedule "%": %', name, problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    first := coalesce(first_run, CASE WHEN cron IS NOT NULL THEN pgmb.cron_next(cron, timezone, now())
                                      ELSE now() + every END);
    INSERT INTO pgmb_schedule AS s (name, cron, every, timezone, missed, routing_key, body, headers,
                                    task, paused, next_run_at, last_runs, runs, created_at)
    VALUES (schedule.name, schedule.cron, schedule.every, schedule.timezone, schedule.missed,
            schedule.routing_key, schedule.body, coalesce(schedule.headers, '{}'), schedule.task, false, first,
            '{}', 0, now())
    ON CONFLICT (name) DO UPDATE
    SET cron = EXCLUDED.cron, every = EXCLUDED.every, timezone = EXCLUDED.timezone, missed = EXCLUDED.missed,
        routing_key = EXCLUDED.routing_key, body = EXCLUDED.body, headers = EXCLUDED.headers,
        task = EXCLUDED.task,
        next_run_at = CASE WHEN schedule.first_run IS NOT NULL
                             OR (s.cron, s.every, s.timezone) IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.every, EXCLUDED.timezone)
                           THEN EXCLUDED.next_run_at ELSE s.next_run_at END
    RETURNING s.id INTO schedule_id;
    -- Woken, a dispatcher asks pgmb.next_wakeup again, which now counts this schedule.
    PERFORM pgmb.wake_dispatchers();
    RETURN schedule_id;
END $$;

-- Pauses schedule `name` (nothing fires until it is resumed); false if there is none.
CREATE OR REPLACE FUNCTION pgmb.pause_schedule(name text) RETURNS boolean
LANGUAGE sql AS $$
    UPDATE pgmb_schedule SET paused = true WHERE pgmb_schedule.name = pause_schedule.name RETURNING true
$$;

-- Resumes schedule `name`. Due times that passed while it was paused are missed runs, which
-- its `missed` policy handles at the next fire. False if there is none.
CREATE OR REPLACE FUNCTION pgmb.resume_schedule(name text) RETURNS boolean
LANGUAGE sql AS $$
    UPDATE pgmb_schedule SET paused = false WHERE pgmb_schedule.name = resume_schedule.name RETURNING true
$$;

-- Deletes schedule `name` (the messages it published stay); false if there was none.
CREATE OR REPLACE FUNCTION pgmb.unschedule(name text) RETURNS boolean
LANGUAGE sql AS $$
    DELETE FROM pgmb_schedule WHERE pgmb_schedule.name = unschedule.name RETURNING true
$$;

-- ---------------------------------------------------------------------------------------
-- Firing
-- ---------------------------------------------------------------------------------------

-- Fires what is due, up to `max_count` messages: each due schedule's row locked FOR UPDATE
-- SKIP LOCKED (another firer holding it fires it; a row it advanced and committed meanwhile
-- is no longer due when read again), its message published through pgmb.send (routing,
-- deduplication, wake-ups as for any message) under the id pgmb.schedule_message_id gives,
-- and the row advanced, in the caller's transaction. Runs missed (a later due time has
-- passed too) follow the schedule's policy: 'skip' fires none of them and goes on to the
-- first due time after now; 'once' fires one message, for the first missed due time, then
-- goes on after now; 'all' fires each, oldest first. A schedule whose message cannot be
-- published (its routing key's rule changed, say) records the error in last_error and
-- tries again an interval (or a minute) later: one schedule never stops the loop. Returns how many were published and, in
-- next_in, the seconds until the next look (0 when max_count was reached).
CREATE OR REPLACE FUNCTION pgmb.fire_due_schedules(max_count integer DEFAULT 100, OUT fired integer, OUT next_in float8)
LANGUAGE plpgsql AS $$
DECLARE
    s pgmb_schedule;
    now_ timestamptz;
    due timestamptz;
    later timestamptz;
    message_id uuid;
    published integer;
BEGIN
    fired := 0;
    FOR s IN SELECT * FROM pgmb_schedule
             WHERE NOT paused AND next_run_at <= clock_timestamp()
             ORDER BY next_run_at LIMIT max_count
             FOR UPDATE SKIP LOCKED LOOP
        published := 0;
        BEGIN
            now_ := clock_timestamp();
            due := s.next_run_at;
            later := pgmb.schedule_after(s, due, due);
            -- Each due time at most once per pass: 'all' catches up over later passes.
            IF later > now_ OR s.missed IN ('once', 'all') THEN
                message_id := pgmb.schedule_message_id(s.id, due);
                IF EXISTS (SELECT FROM pgmb_message WHERE id = message_id) THEN
                    NULL;
                ELSIF s.task IS NULL THEN
                    PERFORM pgmb.send(message_id, s.routing_key, s.body, s.headers, NULL::timestamptz);
                    published := 1;
                ELSIF pgmb.enqueue_task(message_id, s.routing_key, s.body,
                                        -coalesce((s.task ->> 'priority')::integer, 0),
                                        s.task ->> 'backend', s.task ->> 'task_path', s.task ->> 'queue_name',
                                        coalesce((s.task ->> 'priority')::integer, 0), NULL,
                                        coalesce(s.task -> 'args', '[]'), coalesce(s.task -> 'kwargs', '{}'),
                                        coalesce(s.headers, '{}')) IS NULL THEN
                    RAISE EXCEPTION 'no queue is bound to %: the task would never run', s.routing_key;
                ELSE
                    published := 1;
                END IF;
            END IF;
            IF later <= now_ AND s.missed <> 'all' THEN
                later := pgmb.schedule_after(s, due, now_);
            END IF;
            UPDATE pgmb_schedule
            SET next_run_at = later, runs = runs + published, last_error = NULL,
                last_runs = CASE WHEN published = 1 THEN (ARRAY[due] || last_runs)[1:10] ELSE last_runs END
            WHERE id = s.id;
        EXCEPTION WHEN others THEN
            UPDATE pgmb_schedule
            SET next_run_at = clock_timestamp() + coalesce(s.every, interval '1 minute'), last_error = SQLERRM
            WHERE id = s.id;
            RAISE WARNING 'pgmb: schedule "%" could not fire at %: %', s.name, due, SQLERRM;
        END;
        fired := fired + published;
    END LOOP;
    SELECT CASE WHEN fired >= max_count THEN 0
                ELSE greatest(0, extract(epoch FROM min(next_run_at) - clock_timestamp()))::float8 END
    INTO next_in
    FROM pgmb_schedule WHERE NOT paused;
END $$;

-- pgmb.fire_due_schedules' count alone, for a caller of SQL (a pg_cron job, psql).
CREATE OR REPLACE FUNCTION pgmb.fire_schedules(max_count integer DEFAULT 100) RETURNS integer
LANGUAGE sql AS $$ SELECT fired FROM pgmb.fire_due_schedules(max_count) $$;

-- The in-database loop's step: fires what is due and returns when to look next, at most
-- pgmb.indb_reclaim_interval() away (a schedule made meanwhile is seen by then, or sooner
-- through pgmb.next_wakeup).
CREATE OR REPLACE FUNCTION pgmb.loop_fire_schedules() RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    r := pgmb.fire_due_schedules(100);
    RETURN clock_timestamp() + least(coalesce(r.next_in * interval '1 second', pgmb.indb_reclaim_interval()),
                                     pgmb.indb_reclaim_interval());
EXCEPTION WHEN others THEN
    RAISE WARNING 'pgmb: could not fire schedules: %', SQLERRM;
    RETURN clock_timestamp() + pgmb.indb_reclaim_interval();
END $$;

-- Closed, as every function of pgmb's but the reviewed list (access.sql): the owner and
-- pgmb_admin schedule and fire.
REVOKE EXECUTE ON FUNCTION
    pgmb.cron_refuse(text, text), pgmb.cron_number(text, text, integer),
    pgmb.cron_field(text, text, integer), pgmb.cron_fields(text), pgmb.check_time_zone(text),
    pgmb.wall_instant(timestamp, text), pgmb.cron_next(text, text, timestamptz),
    pgmb.cron_day_matches(date, integer[], integer[], boolean),
    pgmb.schedule_after(pgmb_schedule, timestamptz, timestamptz),
    pgmb.schedule_message_id(bigint, timestamptz),
    pgmb.schedule(text, text, jsonb, jsonb, text, interval, text, text, timestamptz, jsonb),
    pgmb.pause_schedule(text), pgmb.resume_schedule(text), pgmb.unschedule(text),
    pgmb.fire_due_schedules(integer), pgmb.fire_schedules(integer), pgmb.loop_fire_schedules()
FROM PUBLIC;

-- pgmb_admin's grants on the new table, as pgmb.apply_access gives every pgmb_* table.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgmb_admin') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON pgmb_schedule TO pgmb_admin;
        GRANT USAGE, SELECT ON SEQUENCE pgmb_schedule_id_seq TO pgmb_admin;
    END IF;
END $$;

-- ==== Spans of the in-database loop's attempts ====
-- (docs/decisions/0091-spans-of-the-in-database-loops-attempts.md) A column with a stable
-- default: no row is rewritten, and 0.1.1's writers of the history, which do not name it,
-- write false.

-- Whether the in-database loop recorded the attempt (its outcome writer, pgmb.loop_record,
-- sets pgmb.indb_recording for the call): pgmb_trace_export makes spans of these, which no
-- dispatcher made (docs/tracing.md). A default, so that no writer of the history names it
-- (0.1.1's included) and an outcome costs one setting read. Not a Django field: nothing in
-- Python reads it but the exporter's SQL. Stable, not volatile: adding it rewrites no row.
ALTER TABLE pgmb_attempt
    ADD COLUMN IF NOT EXISTS indb boolean NOT NULL
        DEFAULT (coalesce(current_setting('pgmb.indb_recording', true), '') = 'on');

-- How far pgmb_trace_export has read the in-database loop's attempts (pgmb_attempt.indb), in
-- the order (created_at, id): one row, none before its first run. Its run locks it, so that
-- two exporters take turns and export each attempt once.
CREATE TABLE IF NOT EXISTS pgmb.trace_export (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    recorded_at timestamptz NOT NULL,
    attempt_id bigint NOT NULL
);

-- ==== Unique while live ====
-- Unique while live (docs/decisions/0090-unique-while-live.md): the columns, the partial
-- unique index pgmb_delivery_unique_key and the admit_unique_key trigger are made by the
-- Django operations before this; the routing trigger (which copies the key) and
-- admit_message's WHEN there too. Here the rule, the functions that admit_message's last
-- step calls (admit_message itself is under "Expiry", as this release leaves it), and
-- pgmb.send_unique. 0.1.1's statements name none of the new columns:
-- their messages have no key and are routed as before.

-- Why a message's unique key or its on_duplicate is refused, or NULL: the rule of
-- pgmb.options.check_unique_key in Python (tests/rules, one table of cases for both). A key
-- of 1 to 128 characters, no blanks or control characters (pgmb.valid_key); on_duplicate
-- 'skip' (NULL is 'skip') or 'replace', the latter only with a key
-- (docs/decisions/0090-unique-while-live.md).
CREATE OR REPLACE FUNCTION pgmb.unique_key_problem(unique_key text, on_duplicate text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN on_duplicate IS NOT NULL AND on_duplicate NOT IN ('skip', 'replace')
            THEN format('invalid on_duplicate %s: it must be ''skip'' or ''replace''', quote_literal(on_duplicate))
        WHEN unique_key IS NULL AND on_duplicate = 'replace'
            THEN 'on_duplicate ''replace'' needs a unique key'
        WHEN unique_key IS NOT NULL AND (length(unique_key) > 128 OR NOT pgmb.valid_key(unique_key))
            THEN format('invalid unique key %s: 1 to 128 characters, no blanks or control characters',
                        quote_literal(unique_key))
    END
$$;

-- The unique key's part of pgmb.admit_message (docs/decisions/0090-unique-while-live.md): its
-- rule (as the check pgmb_message_unique_key_valid), then, the key's lock held to the end of
-- the transaction (publishers of one key take turns; pgmb.admit_unique_delivery takes it
-- too), on each queue the message's routing key matches that has a live delivery with the
-- key: with 'replace', a pending one (ready, delayed, retrying, waiting) is deleted, to be
-- replaced by this message's, and one in flight (leased; on a pull queue, read and not
-- visible again yet) gives its key up, to be followed by this message's; with 'skip', when every such queue has one, NULL: the message is not
-- stored (pgmb.unique_live finds the live one). Where some queues have one and others not,
-- the message is stored and pgmb.admit_unique_delivery leaves those queues out.
CREATE OR REPLACE FUNCTION pgmb.admit_unique(m pgmb_message) RETURNS pgmb_message
LANGUAGE plpgsql AS $$
DECLARE
    problem text := pgmb.unique_key_problem(m.unique_key, m.on_duplicate);
    live record;
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'message % refused by pgmb_message_unique_key_valid: %', m.id, problem
            USING ERRCODE = 'check_violation', CONSTRAINT = 'pgmb_message_unique_key_valid';
    END IF;
    IF m.unique_key IS NULL THEN
        RETURN m;  -- 'skip' without a key: nothing to decide
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('pgmb unique ' || m.unique_key, 0));
    IF m.on_duplicate = 'replace' THEN
        FOR live IN
            SELECT d.id, d.state, d.attempts, d.available_at, q.worker_id FROM pgmb_queue q
            JOIN pgmb_delivery d ON d.queue_id = q.id AND d.unique_key = m.unique_key
            WHERE q.binding_tags <@ pgmb.key_tags(m.routing_key) AND ('.' || m.routing_key) ~ q.pattern
            ORDER BY d.id
            FOR UPDATE OF d
        LOOP
            -- In flight: leased, or a pull queue's message read and not visible again yet
            -- (what pgmb.expire leaves alone too).
            IF live.state = 'leased'
               OR (live.worker_id IS NULL AND live.attempts > 0 AND live.available_at > clock_timestamp()) THEN
                -- Its request is under way: it ends as it would have, this message after it.
                UPDATE pgmb_delivery d SET unique_key = NULL WHERE d.id = live.id;
            ELSE
                DELETE FROM pgmb_delivery d WHERE d.id = live.id;
            END IF;
        END LOOP;
        RETURN m;
    END IF;
    IF EXISTS (SELECT FROM pgmb_queue q
               WHERE q.binding_tags <@ pgmb.key_tags(m.routing_key) AND ('.' || m.routing_key) ~ q.pattern)
       AND NOT EXISTS (SELECT FROM pgmb_queue q
                       WHERE q.binding_tags <@ pgmb.key_tags(m.routing_key) AND ('.' || m.routing_key) ~ q.pattern
                         AND NOT EXISTS (SELECT FROM pgmb_delivery d
                                         WHERE d.queue_id = q.id AND d.unique_key = m.unique_key)) THEN
        RETURN NULL;
    END IF;
    RETURN m;
END $$;

-- Before each delivery with a unique key is stored (the admit_unique_key trigger's WHEN):
-- NULL, so not stored, when its queue has a live delivery with the key: one that
-- pgmb.admit_unique left there (skip), or one made earlier in the same statement. Under the
-- key's lock, so that two publishers never both find the queue free; the partial unique
-- index pgmb_delivery_unique_key is the rule's backstop.
CREATE OR REPLACE FUNCTION pgmb.admit_unique_delivery(d pgmb_delivery) RETURNS pgmb_delivery
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('pgmb unique ' || d.unique_key, 0));
    IF EXISTS (SELECT FROM pgmb_delivery x WHERE x.queue_id = d.queue_id AND x.unique_key = d.unique_key) THEN
        RETURN NULL;
    END IF;
    RETURN d;
END $$;

-- The message whose delivery holds this unique key on a queue of this routing key: what a
-- message that skipped (pgmb.admit_unique stored nothing) is told. The first such queue by
-- name decides; NULL when none holds it (any more).
CREATE OR REPLACE FUNCTION pgmb.unique_live(unique_key text, routing_key text) RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT d.message_id FROM pgmb_queue q
    JOIN pgmb_delivery d ON d.queue_id = q.id AND d.unique_key = unique_live.unique_key
    WHERE q.binding_tags <@ pgmb.key_tags(unique_live.routing_key)
      AND ('.' || unique_live.routing_key) ~ q.pattern
    ORDER BY q.name LIMIT 1
$$;

-- pgmb.send with a unique key (docs/publishing.md, Unique while live): while a delivery with
-- the key is live on a queue of the routing key, the message is skipped there
-- (on_duplicate 'skip', the default) or replaces the pending one (on_duplicate 'replace';
-- one in flight is followed instead). Returns the new message's id; when every queue
-- skipped, nothing is stored and the id of the live one's message is returned (to a caller
-- that may not read messages, the id it sent: docs/decisions/0039-refusals-tell-nothing.md).
-- A function of its own, not an overload of pgmb.send: another optional argument there
-- would make the released forms' calls ambiguous (docs/decisions/0090-unique-while-live.md).
CREATE OR REPLACE FUNCTION pgmb.send_unique(
    id uuid, routing_key text, body jsonb, unique_key text, on_duplicate text DEFAULT 'skip',
    headers jsonb DEFAULT NULL, delay timestamptz DEFAULT NULL, ttl float8 DEFAULT NULL,
    expires_at timestamptz DEFAULT NULL, priority integer DEFAULT 0, group_key text DEFAULT NULL,
    max_retries integer DEFAULT NULL, retry_delay float8 DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    stored uuid;
    live uuid;
    problem text := coalesce(pgmb.unique_key_problem(send_unique.unique_key, send_unique.on_duplicate),
                             pgmb.expiry_problem(send_unique.ttl, send_unique.expires_at));
BEGIN
    IF NOT pgmb.may_publish() THEN
        PERFORM pgmb.require('publish');
    END IF;
    IF id IS NULL THEN
        RAISE EXCEPTION 'a message id is required' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass gen_random_uuid() for a new id.';
    END IF;
    IF send_unique.unique_key IS NULL THEN
        RAISE EXCEPTION 'a unique key is required' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Without one, call pgmb.send.';
    END IF;
    PERFORM pgmb.check_routing_key(routing_key);
    IF body IS NULL THEN
        RAISE EXCEPTION 'a message body is required (JSON null is ''null''::jsonb)'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'message headers must be a JSON object, not %', jsonb_typeof(headers)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pgmb.check_time(delay);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pgmb.check_message_options(send_unique.id, send_unique.priority, send_unique.group_key,
                                       NULL, NULL, send_unique.max_retries, send_unique.retry_delay);
    -- A live delivery settled between the INSERT that skipped and the look-up frees its key:
    -- then the INSERT is tried again (acks do not take the key's lock).
    FOR attempt IN 1..3 LOOP
        INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at, priority,
                                  group_key, max_retries, retry_delay, expires_at, unique_key,
                                  on_duplicate)
        VALUES (send_unique.id, send_unique.routing_key, send_unique.body,
                coalesce(send_unique.headers, '{}'), now(),
                greatest(coalesce(send_unique.delay, now()), now()), send_unique.priority,
                send_unique.group_key, send_unique.max_retries, send_unique.retry_delay,
                coalesce(send_unique.expires_at, now() + send_unique.ttl * interval '1 second'),
                send_unique.unique_key, send_unique.on_duplicate)
        ON CONFLICT ON CONSTRAINT pgmb_message_pkey DO NOTHING
        RETURNING pgmb_message.id INTO stored;
        IF stored IS NOT NULL THEN
            RETURN stored;
        END IF;
        IF NOT pgmb.caller_sees_messages() THEN
            RETURN send_unique.id;
        END IF;
        IF EXISTS (SELECT 1 FROM pgmb_message m WHERE m.id = send_unique.id) THEN
            RAISE EXCEPTION 'message % already exists', send_unique.id
                USING ERRCODE = 'unique_violation',
                      HINT = 'Message ids are unique; pass gen_random_uuid() for a new message.';
        END IF;
        live := pgmb.unique_live(send_unique.unique_key, send_unique.routing_key);
        IF live IS NOT NULL THEN
            RETURN live;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'unique key %: its live delivery kept changing; try again', quote_literal(unique_key)
        USING ERRCODE = 'lock_not_available';
END $$;

SELECT pgmb.pin_definers(ARRAY[
    'pgmb.send_unique(uuid, text, jsonb, text, text, jsonb, timestamptz, float8, timestamptz, integer, text, integer, float8)'
]);
-- The producer API, open as the pgmb.send forms (it checks pgmb_producer, access.sql), its
-- grants in the order a new install gives them (PUBLIC's, then pgmb_admin's).
DO $$
DECLARE
    f constant text := 'pgmb.send_unique(uuid, text, jsonb, text, text, jsonb, timestamptz, float8, timestamptz, integer, text, integer, float8)';
BEGIN
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgmb_admin') THEN
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM pgmb_admin', f);
    END IF;
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f);
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgmb_admin') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO pgmb_admin', f);
    END IF;
END $$;
-- The rule and the triggers' functions, closed as every function of pgmb's but the
-- reviewed list.
REVOKE EXECUTE ON FUNCTION pgmb.unique_key_problem(text, text), pgmb.admit_unique(pgmb_message),
    pgmb.admit_unique_delivery(pgmb_delivery), pgmb.unique_live(text, text) FROM PUBLIC;
