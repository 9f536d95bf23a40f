-- The delivery state machine that both dispatch paths share: claim (lease), start, ack,
-- fail (retry or dead-letter), release, reclaim expired leases; requeueing, purging and
-- replaying; and what a dispatcher asks to know whether, and when, there is work.

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
                    THEN greatest(due, tokens_at + (1 - least(tokens, 1)) / rps * interval '1 second', breaker_until)
               END AS at
        FROM (
            SELECT pgmb.next_due(qu.id) AS due,
                   wk.tokens, coalesce(wk.tokens_at, '-infinity') AS tokens_at, wk.rps, wk.breaker_until
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
BEGIN
    FOR w IN
        SELECT wk.id, array_agg(qu.id ORDER BY random()) AS queue_ids
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
               pgmb.signing_secrets(wk.secret, wk.id, t)
        INTO bucket, breaker, secrets
        FROM pgmb_worker wk WHERE wk.id = w.id
        FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        tokens := least(floor(bucket)::integer, remaining);
        -- Circuit breaker (breakers.sql): open, nothing; after its cool-down, one delivery (the probe).
        IF breaker <> 'closed' THEN tokens := pgmb.breaker_admit(w.id, tokens, t, lease); END IF;
        taken := 0;
        -- Queue by queue, so each claim is an ordered scan of one queue's partial index.
        FOREACH q IN ARRAY w.queue_ids LOOP
            EXIT WHEN tokens <= 0;
            -- The pick, an ordered scan of this queue's part of pgmb_delivery_due; the rows
            -- picked are then found by primary key, whatever the planner thinks of the table.
            picked := ARRAY(
                SELECT d.id FROM pgmb_delivery d
                WHERE d.queue_id = q AND d.state = 'ready' AND d.available_at <= t
                ORDER BY d.priority, d.available_at, d.id
                LIMIT tokens
                FOR NO KEY UPDATE SKIP LOCKED);
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

-- Records successful attempts: the deliveries are deleted and their attempts written to the
-- history (outcome 'ack'); the circuit breakers hear of them first. Planned as pgmb.claim.
CREATE OR REPLACE FUNCTION pgmb.ack(delivery_ids bigint[], statuses integer[] DEFAULT NULL::integer[], durations_ms double precision[] DEFAULT NULL::double precision[]) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
    AS $$
DECLARE
    acked integer;
BEGIN
    PERFORM pgmb.breaker_settle(delivery_ids, NULL, statuses, NULL, true);  -- circuit breakers (breakers.sql)
    WITH input AS (
        SELECT * FROM unnest(delivery_ids, statuses, durations_ms) AS u(id, status, duration_ms)
    ), done AS (
        DELETE FROM pgmb_delivery d USING input u WHERE d.id = u.id AND d.id = ANY (delivery_ids)
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

-- Records failed attempts of leased deliveries (fenced by their lease ids): each is
-- dead-lettered after its last attempt (1 + the message's or the queue's max_retries), or at
-- once after an answer that stops retries (pgmb.final_answer_note: the worker's
-- dead_statuses, or its abort header; the error then says so), or retried after the
-- message's fixed retry_delay or the queue's backoff (an endpoint's Retry-After may lengthen
-- either); every attempt goes to the history, with outcome `retry_outcome` or 'dead'. The
-- circuit breakers hear of the outcomes first. Planned as pgmb.claim.
CREATE OR REPLACE FUNCTION pgmb.settle_failures(delivery_ids bigint[], lease_ids uuid[], statuses integer[], errors text[], retry_after double precision[], durations_ms double precision[], retry_outcome text) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
    AS $$
DECLARE
    settled integer;
BEGIN
    PERFORM pgmb.breaker_settle(delivery_ids, lease_ids, statuses, errors, false);  -- circuit breakers (breakers.sql)
    WITH input AS (
        SELECT * FROM unnest(delivery_ids, lease_ids, statuses, errors, retry_after, durations_ms)
            AS u(id, lease_id, status, error, retry_after, duration_ms)
    ), target AS (
        SELECT d.id, d.message_id, d.queue_id, d.attempts, u.status,
               left(coalesce(f.note, '') || coalesce(u.error, ''), 2000) AS error,
               u.retry_after, u.duration_ms,
               d.attempts >= 1 + coalesce(m.max_retries, q.max_retries) OR f.note IS NOT NULL AS exhausted,
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
        WHERE d.id = t.id AND d.id = ANY (delivery_ids) AND t.exhausted
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
        WHERE d.id = t.id AND d.id = ANY (delivery_ids) AND NOT t.exhausted
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
CREATE OR REPLACE FUNCTION pgmb.release(delivery_ids bigint[], lease_ids uuid[])
RETURNS integer
LANGUAGE sql AS $$
    WITH released AS (
        UPDATE pgmb_delivery d
        SET state = 'ready', lease_id = NULL, attempts = greatest(d.attempts - 1, 0), available_at = now()
        FROM unnest(delivery_ids, lease_ids) AS u(id, lease_id)
        WHERE d.id = u.id AND d.lease_id = u.lease_id AND d.state = 'leased'
        RETURNING 1
    )
    SELECT count(*)::integer FROM released
$$;

-- Leases that ran out (a dispatcher died or hung). One whose request started counts as a
-- failed attempt ('expired'); one that never started is handed back with its attempt
-- ('unsent', due at once), except from a delivery's third such expiry on, which counts.
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
           array_agg(CASE WHEN e.started THEN 'lease expired before an outcome was recorded'
                          ELSE format('lease expired before its request was marked started; counted, '
                                      'as %s earlier leases of this delivery expired so', e.unsent_leases)
                     END) FILTER (WHERE e.counted),
           array_agg(e.id) FILTER (WHERE NOT e.counted),
           array_agg(e.lease_id) FILTER (WHERE NOT e.counted)
    INTO counted_ids, counted_leases, counted_errors, unsent_ids, unsent_lease_ids
    -- At most 2 unsent leases are forgiven (docs/decisions/0006-leases-and-at-least-once.md).
    FROM (SELECT d.id, d.lease_id, d.started, d.unsent_leases,
                 d.started OR d.unsent_leases >= 2 AS counted
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

-- Dead letters back to their queue: attempts start again, due now, with the message's
-- priority, group and dependencies. A requeued delivery gets a new id: in its group it goes
-- behind the members already there (docs/ordering.md).
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
                               priority, group_key, depends_on, dependents)
    SELECT moved.message_id, moved.queue_id, 'ready', 0, now(), now(),
           m.priority, m.group_key, m.depends_on, pgmb.has_dependents(m.id)
    FROM moved JOIN pgmb_message m ON m.id = moved.message_id
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
                               priority, group_key, depends_on, dependents)
    SELECT acked.message_id, acked.queue_id, 'ready', 0, now(), now(),
           m.priority, m.group_key, m.depends_on, pgmb.has_dependents(m.id)
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

-- The advisory lock keys of the archive: 'job' (one archive job at a time, held for its
-- run) and 'claim' (taken by each claim batch, and shared by pgmb.replay).
CREATE OR REPLACE FUNCTION pgmb.archive_lock_key(kind text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('pgmb archive ' || kind, 0)
$$;
