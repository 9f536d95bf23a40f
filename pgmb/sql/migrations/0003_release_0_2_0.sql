-- Migration 0003_release_0_2_0 (pgmb 0.2.0): what changed in pgmb/sql/schema/ since 0.1.1,
-- written by hand, by concern. Every object here is also in pgmb/sql/schema/, which stays
-- the source to read; tests/migrations proves both build the same catalog. 0.1.1's
-- dispatchers keep running while this applies: a function they call keeps its arguments
-- and result (a changed one gets a new name beside it; CONTRIBUTING.md, Migrations).

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

-- Reads up to qty visible messages of a pull queue and hides them for vt seconds (PGMQ's
-- read); `filter` keeps those whose body contains it. The update and the dead-lettering find
-- their rows by primary key (id = ANY (ARRAY(...))), whatever the estimate, so the function
-- uses its generic plan (the settings at the end of this file): planning the statement at
-- every call cost ~8 % of a read(100) + delete (docs/benchmarks.md). The statement's rows
-- go straight to the caller (RETURN QUERY), not through an array
-- (docs/decisions/0064-a-read-returns-its-rows-from-the-statement.md).
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
-- end of its INSERT), the result with the same id. Only when some queue is bound to the
-- key, by the routing rule of pgmb.admit_message and the trigger (the binding's tags, then
-- its pattern); otherwise nothing is written and the result is NULL, the caller's
-- transaction still usable (nothing was raised in it). Returns the result's enqueued_at.
-- A function rather than one statement sent as text: PL/pgSQL plans its statements once a
-- session, where the statement's text was planned at every call and the key's tags
-- computed there by running pgmb.key_tags, not inlined
-- (docs/decisions/0067-a-task-enqueued-by-one-function-call.md).
CREATE OR REPLACE FUNCTION pgmb.enqueue_task(
    id uuid, routing_key text, body jsonb, message_priority integer, backend text,
    task_path text, queue_name text, priority integer, run_after timestamptz, args jsonb,
    kwargs jsonb
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
    VALUES (enqueue_task.id, enqueue_task.routing_key, enqueue_task.body, '{}', now(),
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
                                 timestamptz, jsonb, jsonb)
    SET plan_cache_mode = force_generic_plan;

-- Closed, as every function of pgmb's but the reviewed list (access.sql).
REVOKE EXECUTE ON FUNCTION pgmb.enqueue_task(uuid, text, jsonb, integer, text, text, text,
                                             integer, timestamptz, jsonb, jsonb) FROM PUBLIC;
