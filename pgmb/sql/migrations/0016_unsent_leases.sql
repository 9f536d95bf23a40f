-- pgmb 0016: a lease that expires before its request started does not spend an attempt.
--
-- A claim counts the attempt it leases for (attempts + 1, as before), and a dispatcher that
-- dies holding leases used to spend that attempt on every one of them, posted or not: a
-- dispatcher claims ahead of its free slots, so after a kill -9 with max_retries = 0 half
-- its dead letters had never been sent. Now a dispatcher marks a delivery started
-- (pgmb.start, fenced by lease) when its request starts, and pgmb.reclaim_expired tells the
-- two apart:
--
-- * started: the expiry is a failed attempt, outcome 'expired', as before (dead-lettered
--   at 1 + max_retries);
-- * not started: the attempt is handed back, as pgmb.release does, the delivery is due
--   at once, and the history gets an 'unsent' row (attempt = the number not spent);
-- * not started, but two of this delivery's leases already expired so: counted as if
--   started. A mark rides with the dispatcher's next write of outcomes (a few ms later),
--   so a request that kills its dispatcher at once may never get one; this bound makes
--   such a message reach its dead letter all the same.
--
-- The columns themselves (started, unsent_leases) are added by the Django migration.

-- Leases taken before this migration were counted by the claim and never marked: they
-- settle as they would have (an expiry counts).
UPDATE pgmb_delivery SET started = true WHERE state = 'leased';

CREATE OR REPLACE FUNCTION pgmb.claim(queue_names text[] DEFAULT NULL, max_count integer DEFAULT 100)
RETURNS SETOF pgmb.claimed
LANGUAGE plpgsql AS $$
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

-- Marks leased deliveries started: their requests are on their way, so an expiry of these
-- leases counts as an attempt. Fenced by lease: a mark of a lease that ended (an outcome
-- was recorded, it expired, it was released) changes nothing, and so does a second mark.
-- Returns how many were marked.
CREATE FUNCTION pgmb.start(delivery_ids bigint[], lease_ids uuid[])
RETURNS integer
LANGUAGE plpgsql AS $$
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
    -- At most 2 unsent leases are forgiven (docs/decisions.md).
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

-- As in 0007, with 'unsent' history rows (no request was made) out of the failures.
CREATE OR REPLACE FUNCTION pgmb.metrics_all() RETURNS SETOF pgmb.queue_metrics
LANGUAGE sql STABLE AS $$
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
               count(*) FILTER (WHERE a.outcome NOT IN ('ack', 'unsent')) AS failed
        FROM pgmb_attempt a WHERE a.created_at > now() - interval '1 hour' GROUP BY a.queue_id
    ) h ON h.queue_id = q.id
    ORDER BY q.name
$$;

-- As in 0007, counting only requests: 'unsent' history rows are not requests to the worker.
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
        WHERE a.created_at > now() - interval '1 hour' AND a.outcome <> 'unsent'
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
        WHERE q.worker_id = w.id AND a.outcome NOT IN ('ack', 'unsent')
          AND a.created_at > now() - interval '24 hours'
        ORDER BY a.created_at DESC, a.id DESC LIMIT 1
    ) e ON true
    LEFT JOIN LATERAL (
        SELECT count(*) AS n
        FROM pgmb_attempt a JOIN pgmb_queue q ON q.id = a.queue_id
        WHERE q.worker_id = w.id AND a.outcome NOT IN ('ack', 'unsent')
          AND a.created_at > greatest(s.at, now() - interval '24 hours')
    ) f ON true
    ORDER BY w.name
$$;

-- As in 0008, marking each delivery started before its request, in a transaction it
-- commits anyway: the mark of the next delivery rides with the commit of the previous
-- one's outcome (and the first of a batch, with the claim). Only a request that must
-- first wait for its worker's pacing gets a commit of its own, after the wait.
CREATE OR REPLACE PROCEDURE pgmb.dispatch_loop(seconds float8 DEFAULT 55, batch integer DEFAULT 50,
                                    queue_names text[] DEFAULT NULL, as_job boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + seconds * interval '1 second';
    next_reclaim timestamptz := clock_timestamp();
    claimed pgmb.claimed[];
    c pgmb.claimed;
    following pgmb.claimed;
    outcome pgmb.http_outcome;
    started timestamptz;
    next_post jsonb := '{}';
    wait float8;
    -- Whether the start mark of the delivery about to be posted is committed.
    marked boolean := false;
    me bigint;
    next_beat timestamptz := clock_timestamp() + interval '5 seconds';
    delivered bigint := 0;
    failed bigint := 0;
BEGIN
    IF pgmb.http_transport() IS NULL THEN
        RAISE EXCEPTION 'pgmb: no HTTP transport in this database' USING ERRCODE = 'feature_not_supported';
    END IF;
    -- Registered for the operator (pgmb.dispatchers); committed with the first claim.
    BEGIN
        me := pgmb.dispatcher_start('in_database', coalesce(host(inet_server_addr()), 'local'),
                                    pg_backend_pid(), queue_names);
    EXCEPTION WHEN others THEN
        RAISE WARNING 'pgmb: could not register the dispatcher: %', SQLERRM;
    END;
    WHILE clock_timestamp() < deadline LOOP
        EXIT WHEN as_job AND NOT pgmb.cron_job_scheduled();
        IF me IS NOT NULL AND clock_timestamp() >= next_beat THEN
            BEGIN
                PERFORM pgmb.dispatcher_beat(me, 0, delivered, failed);
            EXCEPTION WHEN others THEN
                RAISE WARNING 'pgmb: could not record a heartbeat: %', SQLERRM;
            END;
            next_beat := clock_timestamp() + interval '5 seconds';
        END IF;
        IF clock_timestamp() >= next_reclaim THEN
            BEGIN
                PERFORM pgmb.reclaim_expired();
            EXCEPTION WHEN others THEN
                RAISE WARNING 'pgmb: could not reclaim expired leases: %', SQLERRM;
            END;
            next_reclaim := clock_timestamp() + interval '5 seconds';
        END IF;
        marked := false;
        BEGIN
            SELECT array_agg(x) INTO claimed FROM pgmb.claim(queue_names, batch) AS x;
            following := claimed[1];
            IF following.delivery_id IS NOT NULL
               AND NOT (following.rps < 1000 AND coalesce((next_post ->> following.worker_id::text)::float8
                                                          > extract(epoch FROM clock_timestamp()), false)) THEN
                PERFORM pgmb.start(ARRAY[following.delivery_id], ARRAY[following.lease_id]);
                marked := true;
            END IF;
        EXCEPTION WHEN others THEN
            -- Nothing claimed: wait as when nothing is due, then try again.
            RAISE WARNING 'pgmb: could not claim: %', SQLERRM;
            claimed := NULL;
            marked := false;
        END;
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
                IF me IS NOT NULL THEN
                BEGIN
                    PERFORM pgmb.dispatcher_stop(me, delivered, failed);
                EXCEPTION WHEN others THEN
                    RAISE WARNING 'pgmb: could not mark the dispatcher stopped: %', SQLERRM;
                END;
            END IF;
                COMMIT;
                RETURN;
            END IF;
            -- Pacing: requests to one worker at least 1/rps apart (the bucket caps the rest).
            IF c.rps < 1000 AND next_post ? c.worker_id::text THEN
                wait := (next_post ->> c.worker_id::text)::float8 - extract(epoch FROM clock_timestamp());
                IF wait > 0 THEN PERFORM pg_sleep(wait); END IF;
            END IF;
            IF NOT marked THEN
                -- A failed mark does not hold the request back: its expiry would then be
                -- forgiven (up to twice), as after a crash within a batch of the external one.
                BEGIN
                    PERFORM pgmb.start(ARRAY[c.delivery_id], ARRAY[c.lease_id]);
                EXCEPTION WHEN others THEN
                    RAISE WARNING 'pgmb: could not mark delivery % started: %', c.delivery_id, SQLERRM;
                END;
                COMMIT;
            END IF;
            marked := false;
            next_post := next_post || jsonb_build_object(c.worker_id::text,
                                                         extract(epoch FROM clock_timestamp()) + 1.0 / c.rps);
            started := clock_timestamp();
            BEGIN
                outcome := pgmb.post(c.endpoint, c.body,
                                     pgmb.request_headers(c, extract(epoch FROM now())::bigint), c.timeout);
            EXCEPTION WHEN others THEN
                outcome := ROW(NULL, 'could not send the request: ' || SQLERRM, NULL,
                               extract(epoch FROM clock_timestamp() - started) * 1000)::pgmb.http_outcome;
            END;
            BEGIN
                IF outcome.status BETWEEN 200 AND 299 THEN
                    PERFORM pgmb.ack(ARRAY[c.delivery_id], ARRAY[outcome.status], ARRAY[outcome.duration_ms]);
                    delivered := delivered + 1;
                ELSE
                    PERFORM pgmb.fail(ARRAY[c.delivery_id], ARRAY[c.lease_id], ARRAY[outcome.status],
                                      ARRAY[outcome.error], ARRAY[outcome.retry_after], ARRAY[outcome.duration_ms]);
                    failed := failed + 1;
                END IF;
                -- The next delivery's start mark, with this commit, if it need not wait.
                following := claimed[i + 1];
                IF following.delivery_id IS NOT NULL
                   AND NOT (following.rps < 1000 AND coalesce((next_post ->> following.worker_id::text)::float8
                                                              > extract(epoch FROM clock_timestamp()), false)) THEN
                    PERFORM pgmb.start(ARRAY[following.delivery_id], ARRAY[following.lease_id]);
                    marked := true;
                END IF;
            EXCEPTION WHEN others THEN
                -- Not even the outcome could be written: the lease runs out and the delivery
                -- is retried, as after a crash.
                RAISE WARNING 'pgmb: could not record the outcome of delivery %: %', c.delivery_id, SQLERRM;
                marked := false;
            END;
            IF me IS NOT NULL AND clock_timestamp() >= next_beat THEN
                BEGIN
                    PERFORM pgmb.dispatcher_beat(me, cardinality(claimed) - i, delivered, failed);
                EXCEPTION WHEN others THEN
                    RAISE WARNING 'pgmb: could not record a heartbeat: %', SQLERRM;
                END;
                next_beat := clock_timestamp() + interval '5 seconds';
            END IF;
            COMMIT;
        END LOOP;
    END LOOP;
    IF me IS NOT NULL THEN
        BEGIN
            PERFORM pgmb.dispatcher_stop(me, delivered, failed);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'pgmb: could not mark the dispatcher stopped: %', SQLERRM;
        END;
    END IF;
END $$;
