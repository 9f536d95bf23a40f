-- Migrating back from 0032: 0031's pgmb.claim, 0022's pgmb.ack, 0016's pgmb.start and
-- 0025's pgmb.settle_failures, with cached plans and no planner settings of their own, and
-- 0031's pgmb.run_headers, which sent a message's own User-Agent.
-- pgmb.read and pgmb.settle_reads lose the planner settings 0032 gave them.

CREATE OR REPLACE FUNCTION pgmb.claim(queue_names text[] DEFAULT NULL::text[], max_count integer DEFAULT 100) RETURNS SETOF pgmb.claimed
    LANGUAGE plpgsql
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
BEGIN
    FOR w IN
        SELECT wk.id, array_agg(qu.id ORDER BY random()) AS queue_ids
        FROM pgmb_queue qu JOIN pgmb_worker wk ON wk.id = qu.worker_id
        WHERE NOT qu.paused AND wk.active
          AND (wk.breaker_until IS NULL OR wk.breaker_until <= t)  -- an open circuit breaker (0022)
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
               wk.breaker_state
        INTO bucket, breaker
        FROM pgmb_worker wk WHERE wk.id = w.id
        FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        tokens := least(floor(bucket)::integer, remaining);
        -- Circuit breaker (0022): open, nothing; after its cool-down, one delivery (the probe).
        IF breaker <> 'closed' THEN tokens := pgmb.breaker_admit(w.id, tokens, t, lease); END IF;
        taken := 0;
        -- Queue by queue, so each claim is an ordered scan of one queue's partial index.
        FOREACH q IN ARRAY w.queue_ids LOOP
            EXIT WHEN tokens <= 0;
            RETURN QUERY
            WITH picked AS (
                SELECT d.id, d.priority, d.available_at FROM pgmb_delivery d
                WHERE d.queue_id = q AND d.state = 'ready' AND d.available_at <= t
                ORDER BY d.priority, d.available_at, d.id
                LIMIT tokens
                FOR NO KEY UPDATE SKIP LOCKED
            ), leased AS (
                -- The attempt is counted now and handed back if the lease expires unstarted.
                UPDATE pgmb_delivery d
                SET state = 'leased', attempts = d.attempts + 1, lease_id = lease, started = false,
                    available_at = t + least(qu.lease_seconds, 2592000) * interval '1 second'
                FROM picked, pgmb_queue qu
                WHERE d.id = picked.id AND qu.id = d.queue_id
                RETURNING d.id, d.attempts, qu.max_retries, d.queue_id, qu.name,
                          d.message_id, qu.lease_seconds, picked.priority, picked.available_at AS due
            )
            SELECT l.id, lease, l.attempts, 1 + coalesce(m.max_retries, l.max_retries), l.queue_id,
                   l.name::text, m.id, m.routing_key::text, m.body::text, m.headers, m.created_at,
                   wk.id, wk.endpoint::text, wk.timeout, wk.secret::text, wk.rps, l.lease_seconds
            FROM leased l
            JOIN pgmb_message m ON m.id = l.message_id
            JOIN pgmb_worker wk ON wk.id = w.id
            -- In the order picked (the joins above may return rows in any order).
            ORDER BY l.priority, l.due, l.id;
            GET DIAGNOSTICS got = ROW_COUNT;
            tokens := tokens - got;
            remaining := remaining - got;
            taken := taken + got;
        END LOOP;
        UPDATE pgmb_worker wk SET tokens = bucket - taken, tokens_at = t WHERE wk.id = w.id;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION pgmb.ack(delivery_ids bigint[], statuses integer[] DEFAULT NULL::integer[], durations_ms double precision[] DEFAULT NULL::double precision[]) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    acked integer;
BEGIN
    PERFORM pgmb.breaker_settle(delivery_ids, NULL, statuses, NULL, true);  -- circuit breakers (0022)
    WITH input AS (
        SELECT * FROM unnest(delivery_ids, statuses, durations_ms) AS u(id, status, duration_ms)
    ), done AS (
        DELETE FROM pgmb_delivery d USING input u WHERE d.id = u.id
        RETURNING d.id, d.message_id, d.queue_id, d.attempts
    ), history AS (
        INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
        SELECT done.message_id, done.queue_id, done.attempts, 'ack', u.status, u.duration_ms, '', clock_timestamp()
        FROM done JOIN input u ON u.id = done.id
        RETURNING 1
    )
    SELECT count(*)::integer INTO acked FROM history;
    RETURN acked;
END $$;

CREATE OR REPLACE FUNCTION pgmb.start(delivery_ids bigint[], lease_ids uuid[]) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    marked integer;
BEGIN
    IF cardinality(delivery_ids) IS DISTINCT FROM cardinality(lease_ids) THEN
        RAISE EXCEPTION 'pgmb.start needs one lease id per delivery id (% delivery ids, % lease ids)',
                        coalesce(cardinality(delivery_ids), 0), coalesce(cardinality(lease_ids), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pgmb_delivery d SET started = true
    FROM unnest(delivery_ids, lease_ids) AS u(id, lease_id)
    WHERE d.id = u.id AND d.lease_id = u.lease_id AND d.state = 'leased' AND NOT d.started;
    GET DIAGNOSTICS marked = ROW_COUNT;
    RETURN marked;
END $$;

CREATE OR REPLACE FUNCTION pgmb.settle_failures(delivery_ids bigint[], lease_ids uuid[], statuses integer[], errors text[], retry_after double precision[], durations_ms double precision[], retry_outcome text) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    settled integer;
BEGIN
    PERFORM pgmb.breaker_settle(delivery_ids, lease_ids, statuses, errors, false);  -- circuit breakers (0022)
    WITH input AS (
        SELECT * FROM unnest(delivery_ids, lease_ids, statuses, errors, retry_after, durations_ms)
            AS u(id, lease_id, status, error, retry_after, duration_ms)
    ), target AS (
        SELECT d.id, d.message_id, d.queue_id, d.attempts, u.status, left(coalesce(u.error, ''), 2000) AS error,
               u.retry_after, u.duration_ms,
               d.attempts >= 1 + coalesce(m.max_retries, q.max_retries) AS exhausted,
               q.backoff_base, q.backoff_max, m.retry_delay
        FROM input u
        JOIN pgmb_delivery d ON d.id = u.id AND d.lease_id = u.lease_id AND d.state = 'leased'
        JOIN pgmb_queue q ON q.id = d.queue_id
        JOIN pgmb_message m ON m.id = d.message_id
        FOR UPDATE OF d
    ), dead AS (
        DELETE FROM pgmb_delivery d USING target t WHERE d.id = t.id AND t.exhausted
        RETURNING d.id
    ), buried AS (
        INSERT INTO pgmb_dead_letter (message_id, queue_id, attempts, last_status, last_error, created_at)
        SELECT t.message_id, t.queue_id, t.attempts, t.status, t.error, clock_timestamp()
        FROM target t JOIN dead ON dead.id = t.id
        ON CONFLICT (message_id, queue_id) DO UPDATE
        SET attempts = excluded.attempts, last_status = excluded.last_status,
            last_error = excluded.last_error, created_at = excluded.created_at
        RETURNING 1
    ), retried AS (
        UPDATE pgmb_delivery d
        SET state = 'ready', lease_id = NULL, last_status = t.status, last_error = t.error,
            available_at = clock_timestamp()
                + CASE WHEN t.retry_delay IS NOT NULL
                       THEN greatest(least(coalesce(t.retry_after, 0), 86400), t.retry_delay)
                       ELSE pgmb.retry_delay(t.attempts, t.backoff_base, t.backoff_max, t.retry_after)
                  END * interval '1 second'
        FROM target t
        WHERE d.id = t.id AND NOT t.exhausted
        RETURNING 1
    ), history AS (
        INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
        SELECT t.message_id, t.queue_id, t.attempts, CASE WHEN t.exhausted THEN 'dead' ELSE retry_outcome END,
               t.status, t.duration_ms, t.error, clock_timestamp()
        FROM target t
        RETURNING 1
    )
    -- Data-modifying CTEs always run to completion, read or not.
    SELECT count(*)::integer INTO settled FROM history;
    RETURN settled;
END $$;

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
                       pgmb.secret_key(c.secret),
                       convert_to(c.message_id::text || '.' || unix_time || '.' || c.body, 'UTF8')), 'base64'))
               END
            ORDER BY c.ordinality)
    INTO built
    FROM unnest(requests) WITH ORDINALITY AS c;
    RETURN built;
END $$;

ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    RESET enable_seqscan RESET enable_bitmapscan RESET enable_sort RESET jit;
ALTER FUNCTION pgmb.settle_reads(text, bigint[], text)
    RESET enable_seqscan RESET enable_bitmapscan RESET jit;
