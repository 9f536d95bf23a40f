-- The in-database loop posts runs of requests in one PL/Python call (docs/decisions.md, "Runs
-- of requests in one PL/Python call"): one PL/pgSQL iteration, one exception block and one
-- pgmb.request_headers statement per request were about half of a delivery's cost once the
-- transport kept its connections (0030), and requests spaced out by that work waited longer
-- for their answers. Rows paced by their worker (rps < 1000), rows whose headers cannot be
-- made, and every row under the http extension's transport keep 0030's one-request path.
-- The batches, start marks, deadline, heartbeats and reclaims are 0030's.
-- pgmb.claim writes a worker's bucket once per claim instead of twice (refilled, then less
-- what was taken): each UPDATE of pgmb_worker runs its validation trigger
-- (pgmb.prepare_worker), about a sixth of a claim of 50. Same tokens, same rows, same order;
-- the rest is 0029's.
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

-- The headers of several requests in one statement (the in-database loop's runs), and the
-- one place of their rule: pgmb.request_headers asks it for one. Set-based, a row's headers
-- cost a third of a call of 0020's pgmb.request_headers. Same results, in the rows' order;
-- one row's fault (a secret stored before the rules refused it) is the statement's.
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

-- 0020's rule, now in pgmb.run_headers.
CREATE OR REPLACE FUNCTION pgmb.request_headers(c pgmb.claimed, unix_time bigint)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (pgmb.run_headers(ARRAY[c], unix_time))[1];
END $$;

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
    runs boolean;
    started timestamptz;
    next_post jsonb := '{}';
    wait float8;
    i integer;
    -- The run starting at row i: rows i .. run_end, their requests, their outcomes.
    run_end integer;
    run_max integer;
    run_urls text[];
    run_bodies text[];
    run_headers jsonb[];
    run_timeouts float8[];
    run_ids bigint[];
    run_leases uuid[];
    run_ok integer;
    paced boolean;
    run_outcomes pgmb.http_outcome[];
    run_first float8;
    run_last_ms float8;
    posted integer;
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
        -- Runs need 0031's PL/Python function, which a database given PL/Python by hand may
        -- lack: then one request at a time, as before.
        transport := pgmb.http_transport();
        runs := transport = 'plpython3u'
                AND to_regprocedure('pgmb.post_run_via_plpython(text[], text[], jsonb[], float8[], integer, '
                                    'float8, float8, float8, float8)') IS NOT NULL;
        -- Whether a run must look for paced rows that end it (most claims have none).
        SELECT coalesce(bool_or(x.rps < 1000), false) INTO paced FROM unnest(claimed) AS x;
        i := 1;
        WHILE i <= cardinality(claimed) LOOP
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
            run_end := NULL;
            IF runs AND c.rps >= 1000 THEN
                -- The run: this row and the unpaced rows after it, as many as the batch has
                -- room for (pgmb.post_run_via_plpython stops earlier at the batch's other
                -- bounds).
                run_end := i - 1 + least(cardinality(claimed) - i + 1, commit_every - cardinality(done_ids));
                IF paced THEN
                    SELECT coalesce(min(k) - 1, run_end) INTO run_end
                    FROM generate_series(i + 1, run_end) AS k
                    WHERE (claimed[k]).rps < 1000;
                END IF;
                -- The headers of the whole run in one statement. Should one row's fail (a
                -- secret stored before the rules refused it, say), the rows before it make
                -- the run, and it goes the one-request way, which records its fault.
                BEGIN
                    run_headers := pgmb.run_headers(claimed[i:run_end], extract(epoch FROM now())::bigint);
                EXCEPTION WHEN others THEN
                    run_max := run_end;
                    run_end := i - 1;
                    WHILE run_end < run_max LOOP
                        BEGIN
                            PERFORM pgmb.request_headers(claimed[run_end + 1], extract(epoch FROM now())::bigint);
                        EXCEPTION WHEN others THEN
                            EXIT;
                        END;
                        run_end := run_end + 1;
                    END LOOP;
                    IF run_end >= i THEN
                        run_headers := pgmb.run_headers(claimed[i:run_end], extract(epoch FROM now())::bigint);
                    ELSE
                        run_end := NULL;
                    END IF;
                END;
                IF run_end IS NOT NULL THEN
                    SELECT array_agg(x.endpoint ORDER BY x.ordinality), array_agg(x.body ORDER BY x.ordinality),
                           array_agg(x.timeout ORDER BY x.ordinality), array_agg(x.delivery_id ORDER BY x.ordinality),
                           array_agg(x.lease_id ORDER BY x.ordinality)
                    INTO run_urls, run_bodies, run_timeouts, run_ids, run_leases
                    FROM unnest(claimed[i:run_end]) WITH ORDINALITY AS x;
                END IF;
            END IF;
            IF c.rps < 1000 THEN
                next_post := next_post || jsonb_build_object(c.worker_id::text,
                                                             extract(epoch FROM clock_timestamp()) + 1.0 / c.rps);
            END IF;
            started := clock_timestamp();
            IF run_end IS NOT NULL THEN
                BEGIN
                    SELECT array_agg(ROW(r.status, r.error, r.retry_after, r.duration_ms)::pgmb.http_outcome ORDER BY r.n),
                           min(r.finished), (array_agg(r.duration_ms ORDER BY r.n DESC))[1],
                           count(*), count(*) FILTER (WHERE r.status BETWEEN 200 AND 299)
                    INTO run_outcomes, run_first, run_last_ms, posted, run_ok
                    FROM pgmb.post_run_via_plpython(
                             run_urls, run_bodies, run_headers, run_timeouts,
                             commit_every - cardinality(done_ids), commit_ms,
                             CASE WHEN cardinality(done_ids) > 0
                                  THEN extract(epoch FROM clock_timestamp() - pending_since) * 1000 END,
                             last_post_ms, extract(epoch FROM deadline)::float8)
                         WITH ORDINALITY AS r(status, error, retry_after, duration_ms, finished, n);
                EXCEPTION WHEN others THEN
                    -- Not a request's fault (those are outcomes): the call's. Recorded against
                    -- the run's first row; the rest go on in the next run.
                    run_outcomes := ARRAY[ROW(NULL, 'could not send the request: ' || SQLERRM, NULL,
                                              extract(epoch FROM clock_timestamp() - started) * 1000)::pgmb.http_outcome];
                    run_first := extract(epoch FROM clock_timestamp());
                    run_last_ms := extract(epoch FROM clock_timestamp() - started) * 1000;
                    posted := 1;
                    run_ok := 0;
                END;
                last_post_ms := run_last_ms;
                IF cardinality(done_ids) = 0 THEN
                    pending_since := to_timestamp(run_first);
                END IF;
                done_ids := done_ids || run_ids[1:posted];
                done_leases := done_leases || run_leases[1:posted];
                done_outcomes := done_outcomes || run_outcomes;
                delivered := delivered + run_ok;
                failed := failed + posted - run_ok;
                i := i + posted;
            ELSE
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
                i := i + 1;
            END IF;
            IF me IS NOT NULL AND clock_timestamp() >= next_beat THEN
                BEGIN
                    PERFORM pgmb.dispatcher_beat(me, cardinality(claimed) - i + 1, delivered, failed);
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
