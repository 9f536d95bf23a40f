-- Reverse of 0016_unsent_leases: claim as 0004 left it, reclaim_expired as 0001, the
-- metrics as 0007, the loop as 0008. Django drops the columns afterwards.
DROP FUNCTION pgmb.start(bigint[], uuid[]);

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
                UPDATE pgmb_delivery d
                SET state = 'leased', attempts = d.attempts + 1, lease_id = lease,
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

CREATE OR REPLACE FUNCTION pgmb.reclaim_expired(max_count integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    leases uuid[];
BEGIN
    SELECT array_agg(d.id), array_agg(d.lease_id) INTO ids, leases
    FROM (SELECT d.id, d.lease_id FROM pgmb_delivery d
          WHERE d.state = 'leased' AND d.available_at <= clock_timestamp()
          ORDER BY d.available_at
          LIMIT max_count
          FOR UPDATE SKIP LOCKED) AS d;
    IF ids IS NULL THEN
        RETURN 0;
    END IF;
    RETURN pgmb.settle_failures(ids, leases, NULL, array_fill('lease expired before an outcome was recorded'::text, ARRAY[cardinality(ids)]),
                                NULL, NULL, 'expired');
END $$;

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
               count(*) FILTER (WHERE a.outcome <> 'ack') AS failed
        FROM pgmb_attempt a WHERE a.created_at > now() - interval '1 hour' GROUP BY a.queue_id
    ) h ON h.queue_id = q.id
    ORDER BY q.name
$$;

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
        WHERE a.created_at > now() - interval '1 hour'
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
        WHERE q.worker_id = w.id AND a.outcome <> 'ack'
          AND a.created_at > now() - interval '24 hours'
        ORDER BY a.created_at DESC, a.id DESC LIMIT 1
    ) e ON true
    LEFT JOIN LATERAL (
        SELECT count(*) AS n
        FROM pgmb_attempt a JOIN pgmb_queue q ON q.id = a.queue_id
        WHERE q.worker_id = w.id AND a.outcome <> 'ack'
          AND a.created_at > greatest(s.at, now() - interval '24 hours')
    ) f ON true
    ORDER BY w.name
$$;

CREATE OR REPLACE PROCEDURE pgmb.dispatch_loop(seconds float8 DEFAULT 55, batch integer DEFAULT 50,
                                    queue_names text[] DEFAULT NULL, as_job boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + seconds * interval '1 second';
    next_reclaim timestamptz := clock_timestamp();
    claimed pgmb.claimed[];
    c pgmb.claimed;
    outcome pgmb.http_outcome;
    started timestamptz;
    next_post jsonb := '{}';
    wait float8;
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
        BEGIN
            SELECT array_agg(x) INTO claimed FROM pgmb.claim(queue_names, batch) AS x;
        EXCEPTION WHEN others THEN
            -- Nothing claimed: wait as when nothing is due, then try again.
            RAISE WARNING 'pgmb: could not claim: %', SQLERRM;
            claimed := NULL;
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
            EXCEPTION WHEN others THEN
                -- Not even the outcome could be written: the lease runs out and the delivery
                -- is retried, as after a crash.
                RAISE WARNING 'pgmb: could not record the outcome of delivery %: %', c.delivery_id, SQLERRM;
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
