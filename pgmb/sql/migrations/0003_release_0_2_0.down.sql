-- Reverse of 0003_release_0_2_0: puts back 0.1.1's objects that it changed, by concern in
-- the same order as the forward file.

-- ==== Pull: history when asked, reads and deletes ====

-- Creates a queue; the documented argument order: (name, binding_key, max_retries,
-- worker_id). worker_id NULL makes a pull queue; an unknown worker id is an error.
-- Returns the queue's id.
CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, max_retries integer, worker_id uuid)
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
    INSERT INTO pgmb_queue (name, binding_key, pattern, worker_id, max_retries)
    VALUES ($1, $2, '', $4, $3)  -- "create" is a keyword, so no create.name
    RETURNING id INTO new_id;
    RETURN new_id;
END $$;

-- Settles read deliveries of one pull queue: deleted from the hot table, one history row
-- each with outcome ('ack' or 'archived'). Returns the ids settled. Ids of another queue
-- are an error; as it is raised after the delete, the delete is undone with the statement,
-- and the common case pays no second look-up.
CREATE OR REPLACE FUNCTION pgmb.settle_reads(queue_name text, delivery_ids bigint[], outcome text)
RETURNS SETOF bigint LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
AS $$
DECLARE
    q record;
    done bigint[];
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    WITH gone AS (
        DELETE FROM pgmb_delivery d
        WHERE d.id = ANY (delivery_ids) AND d.queue_id = q.id
        RETURNING d.id, d.message_id, d.queue_id, d.attempts
    ), history AS (
        INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
        SELECT g.message_id, g.queue_id, g.attempts, settle_reads.outcome, NULL, NULL, '', clock_timestamp()
        FROM gone g
    )
    SELECT array_agg(g.id) INTO done FROM gone g;
    IF delivery_ids IS NULL OR coalesce(cardinality(done), 0) < cardinality(delivery_ids) THEN
        PERFORM pgmb.check_pull_ids(queue_name, q.id, delivery_ids);
    END IF;
    RETURN QUERY SELECT unnest(done);
END $$;


DROP FUNCTION pgmb.set_keep_history(text, boolean);
DROP FUNCTION pgmb.create(text, text, integer, uuid, boolean);
DROP FUNCTION pgmb.check_keep_history(text, uuid, boolean);
ALTER TABLE pgmb_queue DROP CONSTRAINT pgmb_queue_history_pull_only;

-- ==== Pull: reads and deletes, design B ====

-- Reads up to qty visible messages of a pull queue and hides them for vt seconds (PGMQ's
-- read); `filter` keeps those whose body contains it. The update and the dead-lettering find
-- their rows by primary key (id = ANY (ARRAY(...))), whatever the estimate, so the function
-- uses its generic plan (the settings at the end of this file): planning the statement at
-- every call cost ~8 % of a read(100) + delete (docs/benchmarks.md).
CREATE OR REPLACE FUNCTION pgmb.read(queue_name text, vt double precision, qty integer, filter jsonb DEFAULT NULL::jsonb) RETURNS SETOF pgmb.pull_message
LANGUAGE plpgsql AS $$
DECLARE
    -- First, before any expression a planted operator could match (tables.sql).
    closed boolean := pgmb.refuse_writable_schemas();
    q record;
    t timestamptz := clock_timestamp();
    body_filter jsonb := filter -> 'body';
    headers_filter jsonb := filter -> 'headers';
    remaining integer := qty;
    got pgmb.pull_message[];
    buried integer;
    seen bigint[] := '{}';
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    PERFORM pgmb.check_pull_args(vt, qty, filter);
    IF q.paused THEN
        RETURN;
    END IF;
    LOOP
        -- One ordered scan of the queue's part of pgmb_delivery_due, as a push claim's. A
        -- delivery read 1 + max_retries times already is dead-lettered instead, in the same
        -- statement, as pgmb.settle_failures does with push failures.
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
            WHERE d.queue_id = q.id AND d.state = 'ready' AND d.available_at <= t
              AND d.id <> ALL (seen)
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
                             d.attempts, (SELECT p.max_retries FROM picked p WHERE p.id = d.id)) AS error
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
            FROM dead x
            RETURNING 1
        ), r AS (
            UPDATE pgmb_delivery d
            SET attempts = d.attempts + 1, available_at = t + make_interval(secs => vt)
            WHERE d.id = ANY (ARRAY(SELECT p.id FROM picked p WHERE NOT p.exhausted))
            RETURNING d.id, d.message_id, d.attempts, d.created_at, d.available_at, d.priority
        )
        SELECT array_agg(ROW(r.id, r.message_id, r.attempts, r.created_at, r.available_at,
                             m.body, m.headers, m.routing_key)::pgmb.pull_message
                         ORDER BY r.priority, p.was, r.id),
               (SELECT count(*) FROM history)
        INTO got, buried
        FROM r JOIN picked p ON p.id = r.id JOIN pgmb_message m ON m.id = r.message_id;
        IF got IS NOT NULL THEN
            RETURN QUERY SELECT * FROM unnest(got);
            remaining := remaining - cardinality(got);
        END IF;
        -- Only dead-lettered rows make room for more in the same read.
        EXIT WHEN buried = 0 OR remaining <= 0;
        seen := seen || ARRAY(SELECT g.delivery_id FROM unnest(got) AS g);
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

DROP FUNCTION pgmb.enqueue_task(uuid, text, jsonb, integer, text, text, text, integer,
                                timestamptz, jsonb, jsonb);
