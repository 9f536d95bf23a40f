-- The delivery state machine that both dispatch paths share: claim (lease), start, ack,
-- fail (retry or dead-letter), release, reclaim expired leases; requeueing, purging and
-- replaying; cancelling and running now; and what a dispatcher asks to know whether, and
-- when, there is work.

-- Whether a dispatcher running --until-idle still has work: anything due, leased, or
-- scheduled for a retry. Messages their producer delayed do not keep it running, nor do
-- waiting deliveries: one held by a dead-lettered dependency has nothing to do (`pgmb_dispatch
-- --until-idle` would never stop), and one behind a live delivery is busy through that one.
CREATE OR REPLACE FUNCTION pgmb.busy(queue_names text[]) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT EXISTS (
        SELECT 1 FROM pgmb_delivery d JOIN pgmb_queue qu ON qu.id = d.queue_id
        JOIN pgmb_worker wk ON wk.id = qu.worker_id
        WHERE (queue_names IS NULL OR qu.name = ANY (queue_names))
          AND NOT qu.paused AND wk.active
          AND (d.state = 'leased'
               OR (d.state = 'ready' AND (d.attempts > 0 OR d.available_at <= clock_timestamp())))
    )
$$;

-- The first due time of a queue's ready deliveries, and whether one is due by a time: one
-- probe of the claim index per priority in use (it leads with priority, so the queue's
-- first entry is only the earliest of its most urgent priority). Reading the entries
-- instead would read every delayed one. PL/pgSQL: its plans are kept for the session.
CREATE OR REPLACE FUNCTION pgmb.next_due(queue_id uuid, due_by timestamptz DEFAULT NULL) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    lvl smallint;
    due timestamptz;
    earliest timestamptz;
BEGIN
    SELECT d.priority, d.available_at INTO lvl, earliest FROM pgmb_delivery d
    WHERE d.queue_id = next_due.queue_id AND d.state = 'ready'
    ORDER BY d.priority, d.available_at LIMIT 1;
    LOOP
        -- With due_by: any due time not after it will do (the claim asks only that).
        EXIT WHEN lvl IS NULL OR earliest <= due_by;
        SELECT d.priority, d.available_at INTO lvl, due FROM pgmb_delivery d
        WHERE d.queue_id = next_due.queue_id AND d.state = 'ready' AND d.priority > lvl
        ORDER BY d.priority, d.available_at LIMIT 1;
        EXIT WHEN NOT FOUND;
        earliest := least(earliest, due);
    END LOOP;
    RETURN earliest;
END $$;

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
-- rate-limited worker, the next slot of a capped worker that is full (pgmb.slot_free_at),
-- the next lease to expire, the end of a circuit breaker's cool-down.
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

-- Marks leased deliveries as started: their request is about to be made, so the expiry of
-- the lease counts as an attempt (pgmb.reclaim_expired). Fenced by the lease ids. Planned
-- as pgmb.claim.
CREATE OR REPLACE FUNCTION pgmb.start(delivery_ids bigint[], lease_ids uuid[]) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
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
    WHERE d.id = u.id AND d.id = ANY (delivery_ids) AND d.lease_id = u.lease_id AND d.state = 'leased' AND NOT d.started;
    GET DIAGNOSTICS marked = ROW_COUNT;
    RETURN marked;
END $$;

-- The error a history row of a delivery cancelled while leased (pgmb.cancel) begins with.
CREATE OR REPLACE FUNCTION pgmb.canceled_in_flight() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 'canceled while its request was in flight' $$;

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

-- Records failed attempts of leased deliveries (fenced by their lease ids): each is
-- dead-lettered after its last attempt (1 + the message's or the queue's max_retries), or at
-- once after an answer that stops retries (pgmb.final_answer_note: the worker's
-- dead_statuses, or its abort header; the error then says so), or retried after the
-- message's fixed retry_delay or the queue's backoff (an endpoint's Retry-After may lengthen
-- either); every attempt goes to the history, with outcome `retry_outcome` or 'dead'. A
-- delivery cancelled while leased (pgmb.cancel) is neither: it is deleted, its attempt
-- recorded as 'canceled'. The circuit breakers hear of the outcomes first; each dead letter
-- is announced (pgmb.dead_lettered, events.sql). Planned as pgmb.claim.
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

-- Records failed attempts (pgmb.settle_failures with outcome 'retry'): each delivery is
-- retried after its backoff, or dead-lettered after its last attempt.
CREATE OR REPLACE FUNCTION pgmb.fail(
    delivery_ids bigint[], lease_ids uuid[], statuses integer[] DEFAULT NULL, errors text[] DEFAULT NULL,
    retry_after float8[] DEFAULT NULL, durations_ms float8[] DEFAULT NULL)
RETURNS integer
LANGUAGE sql AS $$
    SELECT pgmb.settle_failures(delivery_ids, lease_ids, statuses, errors, retry_after, durations_ms, 'retry')
$$;

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

-- Every dead letter of a queue back to it (pgmb.requeue of their ids).
CREATE OR REPLACE FUNCTION pgmb.requeue(queue_name text)
RETURNS integer
LANGUAGE sql AS $$
    SELECT pgmb.requeue(array_agg(x.id))
    FROM pgmb_dead_letter x JOIN pgmb_queue q ON q.id = x.queue_id
    WHERE q.name = queue_name
$$;

-- Dead letters an operator gives up on: deleted (their attempts stay in the history).
CREATE OR REPLACE FUNCTION pgmb.purge_dead_letters(dead_letter_ids bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM pgmb_dead_letter x WHERE x.id = ANY (dead_letter_ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Every dead letter of a queue, deleted (their attempts stay in the history).
CREATE OR REPLACE FUNCTION pgmb.purge_dead_letters(queue_name text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM pgmb_dead_letter x USING pgmb_queue q
    WHERE q.id = x.queue_id AND q.name = queue_name;
    GET DIAGNOSTICS n = ROW_COUNT;
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

-- The window and count of pgmb.backfill and pgmb.recover, checked: a bounded window (both
-- ends given, the end not before the start) and 1 to 1,000,000 rows a call. Returns the
-- queue's id; an unknown queue is refused. Nothing is written before this passes.
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

-- Gives a queue the stored messages of a window (published at or after `since`, before
-- `until`) that its binding matches and that were published before the queue was made (a
-- later one was routed to it when published): one new delivery each, due at once (or when
-- the message is, if delayed), with the message's priority, group and dependencies, in
-- publish order. A message the queue has or had (a delivery, a dead letter, an attempt) is
-- skipped, so a second call adds nothing; at most max_count a call, oldest first (call
-- again until it returns 0). A queue that keeps no history (a pull queue's keep_history
-- off) is refused: it could not tell what it consumed. Messages archived are no longer
-- stored, and one claimed by an archive run is skipped (the shared claim lock, as
-- pgmb.replay). Returns how many deliveries were created.
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

-- Requeues the dead letters of a queue that died in a window (dead since at or after
-- `since`, before `until`, by default now), oldest first, at most max_count a call
-- (pgmb.requeue: attempts from 0, due now). A requeued dead letter is no longer one, so a
-- second call adds nothing (until a delivery dies again). Takes the archive's shared claim
-- lock, as pgmb.replay. Returns how many were requeued.
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

-- The advisory lock keys of the archive: 'job' (one archive job at a time, held for its
-- run) and 'claim' (taken by each claim batch, and shared by pgmb.replay).
CREATE OR REPLACE FUNCTION pgmb.archive_lock_key(kind text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('pgmb archive ' || kind, 0)
$$;

-- ==== Cancel and run now (docs/decisions/0084-cancel-and-run-now.md) ====

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
