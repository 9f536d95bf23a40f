-- Reverse of 0022_circuit_breaker: the state machine's functions as 0020 (and before) left
-- them, without the breaker. Django drops the columns afterwards.
CREATE OR REPLACE FUNCTION pgmb.ack(delivery_ids bigint[], statuses integer[] DEFAULT NULL::integer[], durations_ms double precision[] DEFAULT NULL::double precision[]) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    acked integer;
BEGIN
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


CREATE OR REPLACE FUNCTION pgmb.settle_failures(delivery_ids bigint[], lease_ids uuid[], statuses integer[], errors text[], retry_after double precision[], durations_ms double precision[], retry_outcome text) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    settled integer;
BEGIN
    WITH input AS (
        SELECT * FROM unnest(delivery_ids, lease_ids, statuses, errors, retry_after, durations_ms)
            AS u(id, lease_id, status, error, retry_after, duration_ms)
    ), target AS (
        SELECT d.id, d.message_id, d.queue_id, d.attempts, u.status, left(coalesce(u.error, ''), 2000) AS error,
               u.retry_after, u.duration_ms, d.attempts >= 1 + q.max_retries AS exhausted,
               q.backoff_base, q.backoff_max
        FROM input u
        JOIN pgmb_delivery d ON d.id = u.id AND d.lease_id = u.lease_id AND d.state = 'leased'
        JOIN pgmb_queue q ON q.id = d.queue_id
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
                + pgmb.retry_delay(t.attempts, t.backoff_base, t.backoff_max, t.retry_after) * interval '1 second'
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
BEGIN
    FOR w IN
        SELECT wk.id, array_agg(qu.id ORDER BY random()) AS queue_ids
        FROM pgmb_queue qu JOIN pgmb_worker wk ON wk.id = qu.worker_id
        WHERE NOT qu.paused AND wk.active
          AND (queue_names IS NULL OR qu.name = ANY (queue_names))
          AND EXISTS (SELECT 1 FROM pgmb_delivery d
                      WHERE d.queue_id = qu.id AND d.state = 'ready' AND d.available_at <= t)
        GROUP BY wk.id
        ORDER BY random()
    LOOP
        EXIT WHEN remaining <= 0;
        -- The bucket is the worker row. If another claim holds it right now, that claim is
        -- serving this worker: skip it rather than wait (as with deliveries).
        PERFORM 1 FROM pgmb_worker wk WHERE wk.id = w.id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        UPDATE pgmb_worker wk
        SET tokens = least(greatest(1, wk.rps * wk.burst),
                           wk.tokens + wk.rps * extract(epoch FROM t - coalesce(wk.tokens_at, t - interval '1 day'))),
            tokens_at = t
        WHERE wk.id = w.id
        RETURNING floor(wk.tokens)::integer INTO tokens;
        tokens := least(tokens, remaining);
        CONTINUE WHEN tokens <= 0;
        -- Queue by queue, so each claim is an ordered scan of one queue's partial index.
        FOREACH q IN ARRAY w.queue_ids LOOP
            EXIT WHEN tokens <= 0;
            RETURN QUERY
            WITH picked AS (
                SELECT d.id FROM pgmb_delivery d
                WHERE d.queue_id = q AND d.state = 'ready' AND d.available_at <= t
                ORDER BY d.available_at, d.id
                LIMIT tokens
                FOR UPDATE SKIP LOCKED
            ), leased AS (
                -- The attempt is counted now and handed back if the lease expires unstarted.
                UPDATE pgmb_delivery d
                SET state = 'leased', attempts = d.attempts + 1, lease_id = lease, started = false,
                    available_at = t + least(qu.lease_seconds, 2592000) * interval '1 second'
                FROM picked, pgmb_queue qu
                WHERE d.id = picked.id AND qu.id = d.queue_id
                RETURNING d.id, d.attempts, 1 + qu.max_retries AS max_attempts, d.queue_id, qu.name,
                          d.message_id, qu.lease_seconds
            )
            SELECT l.id, lease, l.attempts, l.max_attempts, l.queue_id, l.name::text, m.id,
                   m.routing_key::text, m.body::text, m.headers, m.created_at, wk.id,
                   wk.endpoint::text, wk.timeout, wk.secret::text, wk.rps, l.lease_seconds
            FROM leased l
            JOIN pgmb_message m ON m.id = l.message_id
            JOIN pgmb_worker wk ON wk.id = w.id;
            GET DIAGNOSTICS got = ROW_COUNT;
            tokens := tokens - got;
            remaining := remaining - got;
            UPDATE pgmb_worker wk SET tokens = wk.tokens - got WHERE wk.id = w.id AND got > 0;
        END LOOP;
    END LOOP;
END $$;



CREATE OR REPLACE FUNCTION pgmb.next_wakeup(queue_names text[]) RETURNS double precision
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN (SELECT CASE WHEN min(at) IS NOT NULL
                THEN greatest(0, extract(epoch FROM min(at) - clock_timestamp()))::float8 END
    FROM (
        SELECT CASE WHEN due IS NOT NULL
                    THEN greatest(due, tokens_at + (1 - least(tokens, 1)) / rps * interval '1 second')
               END AS at
        FROM (
            SELECT (SELECT min(d.available_at) FROM pgmb_delivery d
                    WHERE d.queue_id = qu.id AND d.state = 'ready') AS due,
                   wk.tokens, coalesce(wk.tokens_at, '-infinity') AS tokens_at, wk.rps
            FROM pgmb_queue qu JOIN pgmb_worker wk ON wk.id = qu.worker_id
            WHERE NOT qu.paused AND wk.active AND (queue_names IS NULL OR qu.name = ANY (queue_names))
        ) AS per_queue
        UNION ALL
        SELECT min(d.available_at) FROM pgmb_delivery d JOIN pgmb_queue qu ON qu.id = d.queue_id
        WHERE d.state = 'leased' AND (queue_names IS NULL OR qu.name = ANY (queue_names))
    ) AS candidates);
END $$;



CREATE OR REPLACE FUNCTION pgmb.prepare_worker(w public.pgmb_worker) RETURNS public.pgmb_worker
    LANGUAGE plpgsql
    AS $_$
DECLARE
    problem text;
BEGIN
    PERFORM pgmb.check_name('worker', w.name);
    IF (w.endpoint IS NULL
        OR w.endpoint !~ '^[Hh][Tt][Tt][Pp][Ss]?://[^/?#\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]+(?:[/?#][^\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]*)?$')
       AND NOT EXISTS (SELECT 1 FROM pgmb_worker o WHERE o.id = w.id AND o.endpoint = w.endpoint) THEN
        RAISE EXCEPTION 'invalid endpoint % for worker %', quote_nullable(w.endpoint), w.name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The endpoint must be an http:// or https:// URL without blanks.';
    END IF;
    IF w.rps IS NULL OR w.rps <= 0 THEN
        RAISE EXCEPTION 'invalid rps % for worker %: it must be at least 1 request per second', w.rps, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.timeout IS NULL OR w.timeout <= 0 THEN
        RAISE EXCEPTION 'invalid timeout % for worker %: it must be positive', w.timeout, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    problem := pgmb.secret_problem(w.secret);
    IF problem IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM pgmb_worker o WHERE o.id = w.id AND o.secret = w.secret) THEN
        RAISE EXCEPTION 'invalid secret for worker %: %', w.name, problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use whsec_ and base64 (padded or not), or a text without control characters.';
    END IF;
    RETURN w;
END $_$;


DROP FUNCTION pgmb.breaker_reset(uuid[]);
DROP FUNCTION pgmb.breaker_admit(uuid, integer, timestamptz, uuid);
DROP FUNCTION pgmb.breaker_settle(bigint[], uuid[], integer[], text[], boolean);
DROP FUNCTION pgmb.breaker_describe(integer, text);
DROP FUNCTION pgmb.breaker_announce(text, text, text);
DROP FUNCTION pgmb.breaker_cooldown(float8, float8, integer);
DROP FUNCTION pgmb.breaker_counts(integer);
DROP FUNCTION pgmb.check_breaker(pgmb_worker);
ALTER TABLE pgmb_worker DROP CONSTRAINT pgmb_worker_breaker_state;
DROP INDEX pgmb_worker_breaker;
