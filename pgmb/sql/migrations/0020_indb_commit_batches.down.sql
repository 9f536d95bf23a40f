-- Reverse of 0020_indb_commit_batches: the loop as 0016 left it (a COMMIT per outcome).
-- As in 0008, marking each delivery started before its request, in a transaction it
-- commits anyway (0016).
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

DROP FUNCTION pgmb.record_outcomes(bigint[], uuid[], pgmb.http_outcome[]);
DROP FUNCTION pgmb.indb_commit_bounds();

-- As 0003 and 0001 left them.
CREATE OR REPLACE FUNCTION pgmb.request_headers(c pgmb.claimed, unix_time bigint) RETURNS jsonb
LANGUAGE sql STABLE AS $$
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
           END
$$;

CREATE OR REPLACE FUNCTION pgmb.http_transport() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'http') THEN 'http'
        WHEN to_regprocedure('pgmb.post_via_plpython(text, text, jsonb, float8)') IS NOT NULL THEN 'plpython3u'
    END
$$;
