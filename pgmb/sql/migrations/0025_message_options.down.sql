-- Reverse of 0025_message_options: the functions as 0024 left them. Django puts the routing
-- trigger of 0019 back and removes the option triggers first, and drops the columns after.

-- django-pgtrigger has dropped the option triggers but leaves their functions behind.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.proname ~ '^pgtrigger_(admit_message|hold_delivery|release_after_delivery|release_after_dead_letter)_[0-9a-f]+$'
    LOOP
        EXECUTE format('DROP FUNCTION %s CASCADE', f);
    END LOOP;
END $$;

-- Deliveries that wait would be stuck without the triggers that release them.
UPDATE pgmb_delivery SET state = 'ready' WHERE state = 'waiting';
ALTER TABLE pgmb_delivery DROP CONSTRAINT pgmb_delivery_state_valid;
ALTER TABLE pgmb_delivery
    ADD CONSTRAINT pgmb_delivery_state_valid CHECK (state::text = ANY ('{ready,leased}'::text[]));

CREATE OR REPLACE VIEW pgmb.queue_entries AS
SELECT d.queue_id, q.name AS queue, d.message_id, m.routing_key, m.body, m.headers,
       CASE WHEN d.available_at <= now() THEN 'ready'
            WHEN d.state = 'leased' THEN 'leased'
            ELSE 'delayed' END AS state,
       false AS acknoledge, false AS acknowledged,
       d.attempts, d.available_at AS enqueued_at, m.created_at, NULL::timestamptz AS acknowledged_at
FROM pgmb_delivery d
JOIN pgmb_queue q ON q.id = d.queue_id
JOIN pgmb_message m ON m.id = d.message_id
UNION ALL
SELECT a.queue_id, q.name, a.message_id, m.routing_key, m.body, m.headers,
       'acked', true, true, a.attempt, NULL, m.created_at, a.created_at
FROM pgmb_attempt a
JOIN pgmb_queue q ON q.id = a.queue_id
JOIN pgmb_message m ON m.id = a.message_id
WHERE a.outcome = 'ack';

DROP FUNCTION pgmb.send(uuid, text, jsonb, jsonb, timestamptz, integer, text, uuid[], text, integer, float8);

-- The functions as 0024 left them (0021's access check in pgmb.send; 0022's circuit breaker
-- in claim, next_wakeup and settle_failures; 0023's pull reads and metrics).
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
BEGIN
    FOR w IN
        SELECT wk.id, array_agg(qu.id ORDER BY random()) AS queue_ids
        FROM pgmb_queue qu JOIN pgmb_worker wk ON wk.id = qu.worker_id
        WHERE NOT qu.paused AND wk.active
          AND (wk.breaker_until IS NULL OR wk.breaker_until <= t)  -- an open circuit breaker (0022)
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
        RETURNING floor(wk.tokens)::integer, wk.breaker_state INTO tokens, breaker;
        tokens := least(tokens, remaining);
        -- Circuit breaker (0022): open, nothing; after its cool-down, one delivery (the probe).
        IF breaker <> 'closed' THEN tokens := pgmb.breaker_admit(w.id, tokens, t, lease); END IF;
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
                    THEN greatest(due, tokens_at + (1 - least(tokens, 1)) / rps * interval '1 second', breaker_until)
               END AS at
        FROM (
            SELECT (SELECT min(d.available_at) FROM pgmb_delivery d
                    WHERE d.queue_id = qu.id AND d.state = 'ready') AS due,
                   wk.tokens, coalesce(wk.tokens_at, '-infinity') AS tokens_at, wk.rps, wk.breaker_until
            FROM pgmb_queue qu JOIN pgmb_worker wk ON wk.id = qu.worker_id
            WHERE NOT qu.paused AND wk.active AND (queue_names IS NULL OR qu.name = ANY (queue_names))
        ) AS per_queue
        UNION ALL
        SELECT min(d.available_at) FROM pgmb_delivery d JOIN pgmb_queue qu ON qu.id = d.queue_id
        WHERE d.state = 'leased' AND (queue_names IS NULL OR qu.name = ANY (queue_names))
    ) AS candidates);
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

CREATE OR REPLACE FUNCTION pgmb.requeue(dead_letter_ids bigint[]) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    n integer;
BEGIN
    WITH moved AS (
        DELETE FROM pgmb_dead_letter x WHERE x.id = ANY (dead_letter_ids)
        RETURNING x.message_id, x.queue_id
    )
    INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at, created_at)
    SELECT message_id, queue_id, 'ready', 0, now(), now() FROM moved
    ON CONFLICT (message_id, queue_id) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM pg_notify('pgmb', '');
    END IF;
    RETURN n;
END $$;

CREATE OR REPLACE FUNCTION pgmb.replay(message_ids uuid[], queue_names text[] DEFAULT NULL::text[]) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    n integer;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(pgmb.archive_lock_key('claim'));
    INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at, created_at)
    SELECT acked.message_id, acked.queue_id, 'ready', 0, now(), now()
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

CREATE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb, delay timestamp with time zone) RETURNS uuid
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pgmb.require('publish');
    IF id IS NULL THEN
        RAISE EXCEPTION 'a message id is required' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass gen_random_uuid() for a new id.';
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
    IF EXISTS (SELECT 1 FROM pgmb_message m WHERE m.id = send.id) THEN
        RAISE EXCEPTION 'message % already exists', send.id
            USING ERRCODE = 'unique_violation',
                  HINT = 'Message ids are unique; pass gen_random_uuid() for a new message.';
    END IF;
    INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at)
    VALUES (send.id, send.routing_key, send.body, coalesce(send.headers, '{}'), now(),
            greatest(coalesce(send.delay, now()), now()));
    RETURN send.id;
END $$;

CREATE OR REPLACE FUNCTION pgmb.metrics_all() RETURNS SETOF pgmb.queue_metrics
    LANGUAGE sql STABLE
    AS $$
    SELECT q.name::text,
           r.n + coalesce(l.n, 0),
           r.due,
           extract(epoch FROM now() - greatest(r.newest, l.newest))::float8,
           extract(epoch FROM now() - r.oldest_due)::float8,
           r.n + coalesce(l.n, 0) + x.n + a.n,
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
        SELECT d.queue_id, count(*) AS n, max(d.created_at) AS newest
        FROM pgmb_delivery d WHERE d.state = 'leased' GROUP BY d.queue_id
    ) l ON l.queue_id = q.id
    LEFT JOIN (
        SELECT a.queue_id,
               count(*) FILTER (WHERE a.outcome = 'ack') AS delivered,
               count(*) FILTER (WHERE a.outcome NOT IN ('ack', 'unsent', 'archived')) AS failed
        FROM pgmb_attempt a WHERE a.created_at > now() - interval '1 hour' GROUP BY a.queue_id
    ) h ON h.queue_id = q.id
    ORDER BY q.name
$$;

CREATE OR REPLACE FUNCTION pgmb.busy(queue_names text[]) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT EXISTS (
        SELECT 1 FROM pgmb_delivery d JOIN pgmb_queue qu ON qu.id = d.queue_id
        JOIN pgmb_worker wk ON wk.id = qu.worker_id
        WHERE (queue_names IS NULL OR qu.name = ANY (queue_names))
          AND NOT qu.paused AND wk.active
          AND (d.state = 'leased' OR d.attempts > 0 OR d.available_at <= clock_timestamp())
    )
$$;

CREATE OR REPLACE FUNCTION pgmb.read(queue_name text, vt double precision, qty integer, filter jsonb DEFAULT NULL::jsonb) RETURNS SETOF pgmb.pull_message
    LANGUAGE plpgsql
    AS $$
DECLARE
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
            SELECT d.id, d.available_at AS was, d.attempts >= 1 + q.max_retries AS exhausted
            FROM pgmb_delivery d
            WHERE d.queue_id = q.id AND d.state = 'ready' AND d.available_at <= t
              AND d.id <> ALL (seen)
              AND (filter IS NULL
                   OR EXISTS (SELECT 1 FROM pgmb_message m
                              WHERE m.id = d.message_id
                                AND (body_filter IS NULL OR m.body @> body_filter)
                                AND (headers_filter IS NULL OR m.headers @> headers_filter)))
            ORDER BY d.available_at, d.id
            LIMIT remaining
            FOR UPDATE SKIP LOCKED
        ), dead AS (
            DELETE FROM pgmb_delivery d USING picked p WHERE d.id = p.id AND p.exhausted
            RETURNING d.message_id, d.queue_id, d.attempts, d.last_status,
                      format('read %s times and never deleted (max_retries %s): dead-lettered instead of read again',
                             d.attempts, q.max_retries) AS error
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
            FROM picked p
            WHERE d.id = p.id AND NOT p.exhausted
            RETURNING d.id, d.message_id, d.attempts, d.created_at, d.available_at, p.was
        )
        SELECT array_agg(ROW(r.id, r.message_id, r.attempts, r.created_at, r.available_at,
                             m.body, m.headers, m.routing_key)::pgmb.pull_message
                         ORDER BY r.was, r.id),
               (SELECT count(*) FROM history)
        INTO got, buried
        FROM r JOIN pgmb_message m ON m.id = r.message_id;
        IF got IS NOT NULL THEN
            RETURN QUERY SELECT * FROM unnest(got);
            remaining := remaining - cardinality(got);
        END IF;
        -- Only dead-lettered rows make room for more in the same read.
        EXIT WHEN buried = 0 OR remaining <= 0;
        seen := seen || ARRAY(SELECT g.delivery_id FROM unnest(got) AS g);
    END LOOP;
END $$;

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
        SELECT d.id, d.message_id, d.queue_id, d.attempts, u.error, d.attempts >= 1 + qu.max_retries AS exhausted,
               qu.backoff_base, qu.backoff_max
        FROM input u
        JOIN pgmb_delivery d ON d.id = u.id AND d.attempts = u.read_ct AND d.state = 'ready'
        JOIN pgmb_queue qu ON qu.id = d.queue_id AND qu.id = q.id
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
        RETURNING 1
    ), retried AS (
        UPDATE pgmb_delivery d
        SET last_status = NULL, last_error = t.error,
            available_at = clock_timestamp()
                + pgmb.retry_delay(t.attempts, t.backoff_base, t.backoff_max) * interval '1 second'
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

CREATE OR REPLACE FUNCTION pgmb.pull_next_visible(queue_name text) RETURNS double precision
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    q record;
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    IF q.paused THEN
        RETURN NULL;
    END IF;
    -- greatest() skips NULLs: an empty queue's min() must stay NULL.
    RETURN (SELECT CASE WHEN min(d.available_at) IS NOT NULL
                        THEN greatest(0, extract(epoch FROM min(d.available_at) - clock_timestamp()))::float8 END
            FROM pgmb_delivery d WHERE d.queue_id = q.id AND d.state = 'ready');
END $$;

DO $$
DECLARE
    tables name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE c.oid = 'pgmb_message'::regclass);
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['pgmb.send(uuid, text, jsonb, jsonb, timestamptz)',
                             'pgmb.read(text, double precision, integer, jsonb)',
                             'pgmb.nack(text, bigint[], integer[], text[])',
                             'pgmb.pull_next_visible(text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp', f, tables);
    END LOOP;
END $$;

CREATE INDEX IF NOT EXISTS pgmb_delivery_due_plain
    ON pgmb_delivery (queue_id, available_at, id) INCLUDE (attempts, created_at)
    WHERE state = 'ready';
DROP INDEX IF EXISTS pgmb_delivery_due;
ALTER INDEX pgmb_delivery_due_plain RENAME TO pgmb_delivery_due;
DROP INDEX pgmb_delivery_group;
DROP INDEX pgmb_delivery_waiting;
DROP INDEX pgmb_delivery_depends_on;
DROP INDEX pgmb_message_dedup;

ALTER TABLE pgmb_queue DROP CONSTRAINT pgmb_queue_dedup_window_valid;
ALTER TABLE pgmb_message DROP CONSTRAINT pgmb_message_options_valid;

DROP FUNCTION pgmb.next_due(uuid, timestamptz);
DROP FUNCTION pgmb.release_dependents(uuid);
DROP FUNCTION pgmb.release_after(pgmb_delivery);
DROP FUNCTION pgmb.promote_waiting(bigint[]);
DROP FUNCTION pgmb.has_dependents(uuid);
DROP FUNCTION pgmb.hold_delivery(pgmb_delivery);
DROP FUNCTION pgmb.delivery_blocked(bigint, uuid, text, uuid[]);
DROP FUNCTION pgmb.deduplicated(text);
DROP FUNCTION pgmb.admit_message(pgmb_message);
DROP FUNCTION pgmb.check_message_options(uuid, integer, text, uuid[], text, integer, float8);
DROP FUNCTION pgmb.message_options_problem(uuid, integer, text, uuid[], text, integer, float8);
