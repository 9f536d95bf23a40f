-- Reverse of 0008_dispatchers: the loop as 0004 left it, maintenance as 0001 did.
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
BEGIN
    IF pgmb.http_transport() IS NULL THEN
        RAISE EXCEPTION 'pgmb: no HTTP transport in this database' USING ERRCODE = 'feature_not_supported';
    END IF;
    WHILE clock_timestamp() < deadline LOOP
        EXIT WHEN as_job AND NOT pgmb.cron_job_scheduled();
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
                ELSE
                    PERFORM pgmb.fail(ARRAY[c.delivery_id], ARRAY[c.lease_id], ARRAY[outcome.status],
                                      ARRAY[outcome.error], ARRAY[outcome.retry_after], ARRAY[outcome.duration_ms]);
                END IF;
            EXCEPTION WHEN others THEN
                -- Not even the outcome could be written: the lease runs out and the delivery
                -- is retried, as after a crash.
                RAISE WARNING 'pgmb: could not record the outcome of delivery %: %', c.delivery_id, SQLERRM;
            END;
            COMMIT;
        END LOOP;
    END LOOP;
END $$;

-- Housekeeping for the pg_cron path: expired leases, and pg_cron's own run log.
CREATE OR REPLACE FUNCTION pgmb.maintenance(keep interval DEFAULT '1 day') RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    reclaimed integer := pgmb.reclaim_expired(10000);
BEGIN
    IF to_regclass('cron.job_run_details') IS NOT NULL THEN
        EXECUTE 'DELETE FROM cron.job_run_details WHERE end_time < now() - $1' USING keep;
    END IF;
    RETURN reclaimed;
END $$;

DROP VIEW pgmb.dispatchers;
DROP FUNCTION pgmb.dispatcher_stop(bigint, bigint, bigint);
DROP FUNCTION pgmb.dispatcher_beat(bigint, integer, bigint, bigint);
DROP FUNCTION pgmb.dispatcher_start(text, text, integer, text[]);
DROP FUNCTION pgmb.dispatcher_state(timestamptz, timestamptz, timestamptz);
