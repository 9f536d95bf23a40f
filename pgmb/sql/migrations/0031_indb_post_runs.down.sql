-- Migrating back from 0031: the loop of 0030, which posts one request per PL/pgSQL
-- iteration, 0020's pgmb.request_headers, which held the headers' rule itself, and
-- 0029's pgmb.claim.
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
            UPDATE pgmb_worker wk SET tokens = wk.tokens - got WHERE wk.id = w.id AND got > 0;
        END LOOP;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION pgmb.request_headers(c pgmb.claimed, unix_time bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    built jsonb;
BEGIN
    SELECT coalesce((
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
           END INTO built;
    RETURN built;
END $$;

DROP FUNCTION IF EXISTS pgmb.run_headers(pgmb.claimed[], bigint);

CREATE OR REPLACE PROCEDURE pgmb.dispatch_loop(seconds float8 DEFAULT 55, batch integer DEFAULT 50,
                                    queue_names text[] DEFAULT NULL, as_job boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    commit_every integer;
    commit_ms float8;
    deadline timestamptz := clock_timestamp() + seconds * interval '1 second';
    next_reclaim timestamptz := clock_timestamp();
    claimed pgmb.claimed[];
    c pgmb.claimed;
    outcome pgmb.http_outcome;
    transport text;
    started timestamptz;
    next_post jsonb := '{}';
    wait float8;
    -- The outcomes not yet recorded, since when, and how long the last request took (the
    -- guess for the next one).
    done_ids bigint[] := '{}';
    done_leases uuid[] := '{}';
    done_outcomes pgmb.http_outcome[] := '{}';
    pending_since timestamptz;
    last_post_ms float8 := 0;
    me bigint;
    next_beat timestamptz := clock_timestamp() + interval '5 seconds';
    delivered bigint := 0;
    failed bigint := 0;
BEGIN
    -- Read first: a bad setting stops the loop before it writes anything.
    SELECT b.commit_every, b.commit_ms INTO commit_every, commit_ms FROM pgmb.indb_commit_bounds() AS b;
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
        IF claimed IS NULL THEN
            -- Nothing waits for a sleep: the outcomes kept so far are committed first.
            PERFORM pgmb.record_outcomes(done_ids, done_leases, done_outcomes);
            done_ids := '{}';
            done_leases := '{}';
            done_outcomes := '{}';
            COMMIT;
            wait := least(coalesce(pgmb.next_wakeup(queue_names), 1), 1,
                          extract(epoch FROM deadline - clock_timestamp()));
            COMMIT;
            PERFORM pg_sleep(greatest(wait, 0.005));
            CONTINUE;
        END IF;
        -- Once per claim: an http extension created or dropped meanwhile is seen at the next.
        transport := pgmb.http_transport();
        FOR i IN 1 .. cardinality(claimed) LOOP
            c := claimed[i];
            IF clock_timestamp() >= deadline THEN
                -- Out of time: hand back what was not posted, unattempted.
                PERFORM pgmb.release(ARRAY(SELECT x.delivery_id FROM unnest(claimed[i:]) AS x),
                                     ARRAY(SELECT x.lease_id FROM unnest(claimed[i:]) AS x));
                EXIT;
            END IF;
            -- Pacing: requests to one worker at least 1/rps apart (the bucket caps the rest).
            wait := 0;
            IF c.rps < 1000 AND next_post ? c.worker_id::text THEN
                wait := (next_post ->> c.worker_id::text)::float8 - extract(epoch FROM clock_timestamp());
            END IF;
            -- A COMMIT before this request: the claim's (the first of a claim), before and
            -- after a pacing wait (nothing waits for a sleep), or the batch's, once it is
            -- full or its oldest outcome would wait too long. This request's start mark
            -- goes with it.
            IF i = 1 OR wait > 0
               OR cardinality(done_ids) >= commit_every
               OR (cardinality(done_ids) > 0
                   AND extract(epoch FROM clock_timestamp() - pending_since) * 1000 + last_post_ms >= commit_ms) THEN
                PERFORM pgmb.record_outcomes(done_ids, done_leases, done_outcomes);
                done_ids := '{}';
                done_leases := '{}';
                done_outcomes := '{}';
                IF wait > 0 THEN
                    COMMIT;
                    PERFORM pg_sleep(wait);
                END IF;
                -- A failed mark does not hold the request back: its expiry would then be
                -- forgiven (up to twice), as after a crash within a batch.
                BEGIN
                    PERFORM pgmb.start(ARRAY[c.delivery_id], ARRAY[c.lease_id]);
                EXCEPTION WHEN others THEN
                    RAISE WARNING 'pgmb: could not mark delivery % started: %', c.delivery_id, SQLERRM;
                END;
                COMMIT;
            END IF;
            IF c.rps < 1000 THEN
                next_post := next_post || jsonb_build_object(c.worker_id::text,
                                                             extract(epoch FROM clock_timestamp()) + 1.0 / c.rps);
            END IF;
            started := clock_timestamp();
            BEGIN
                -- Two statements, not one CASE: an expression naming pgmb.post_via_plpython
                -- cannot even be planned where PL/Python is missing.
                IF transport = 'plpython3u' THEN
                    outcome := pgmb.post_via_plpython(c.endpoint, c.body,
                                                      pgmb.request_headers(c, extract(epoch FROM now())::bigint), c.timeout);
                ELSE
                    outcome := pgmb.post(c.endpoint, c.body,
                                         pgmb.request_headers(c, extract(epoch FROM now())::bigint), c.timeout);
                END IF;
            EXCEPTION WHEN others THEN
                outcome := ROW(NULL, 'could not send the request: ' || SQLERRM, NULL,
                               extract(epoch FROM clock_timestamp() - started) * 1000)::pgmb.http_outcome;
            END;
            last_post_ms := extract(epoch FROM clock_timestamp() - started) * 1000;
            IF cardinality(done_ids) = 0 THEN
                pending_since := clock_timestamp();
            END IF;
            done_ids := done_ids || c.delivery_id;
            done_leases := done_leases || c.lease_id;
            done_outcomes := done_outcomes || outcome;
            IF outcome.status BETWEEN 200 AND 299 THEN
                delivered := delivered + 1;
            ELSE
                failed := failed + 1;
            END IF;
            IF me IS NOT NULL AND clock_timestamp() >= next_beat THEN
                BEGIN
                    PERFORM pgmb.dispatcher_beat(me, cardinality(claimed) - i, delivered, failed);
                EXCEPTION WHEN others THEN
                    RAISE WARNING 'pgmb: could not record a heartbeat: %', SQLERRM;
                END;
                next_beat := clock_timestamp() + interval '5 seconds';
            END IF;
        END LOOP;
    END LOOP;
    -- The last outcomes, committed with the CALL.
    PERFORM pgmb.record_outcomes(done_ids, done_leases, done_outcomes);
    IF me IS NOT NULL THEN
        BEGIN
            PERFORM pgmb.dispatcher_stop(me, delivered, failed);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'pgmb: could not mark the dispatcher stopped: %', SQLERRM;
        END;
    END IF;
END $$;
