-- pgmb 0008: running dispatchers register and heartbeat, so an operator sees them.
-- Each dispatcher (pgmb_dispatch, or the in-database loop) has a row in pgmb_dispatcher
-- from its start; it beats every few seconds with its counters and marks itself stopped
-- on a graceful exit. One that stops beating without saying so (killed, its machine or
-- connection lost) is shown as gone once its last heartbeat is 60 s old. Stopped and gone
-- rows are removed by pgmb.maintenance() after a day.

-- running, gone (no heartbeat for 60 s, as seen at `at`) or stopped.
CREATE FUNCTION pgmb.dispatcher_state(heartbeat_at timestamptz, stopped_at timestamptz,
                                      at timestamptz DEFAULT now())
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN stopped_at IS NOT NULL THEN 'stopped'
                WHEN heartbeat_at < at - interval '60 seconds' THEN 'gone'
                ELSE 'running' END
$$;

-- Register a dispatcher; returns its id. A scheduled in-database loop runs again and
-- again (every second with pg_cron >= 1.5): its runs are one dispatcher over time, so a
-- new run replaces the stopped rows of earlier runs (same host and queues).
CREATE FUNCTION pgmb.dispatcher_start(kind text, host text, pid integer, queues text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    new_id bigint;
BEGIN
    IF kind = 'in_database' THEN
        DELETE FROM pgmb_dispatcher d
        WHERE d.kind = 'in_database' AND d.stopped_at IS NOT NULL
          AND d.host = dispatcher_start.host AND d.queues IS NOT DISTINCT FROM dispatcher_start.queues;
    END IF;
    INSERT INTO pgmb_dispatcher (kind, host, pid, queues, started_at, heartbeat_at)
    VALUES (kind, coalesce(host, ''), pid, queues, clock_timestamp(), clock_timestamp())
    RETURNING pgmb_dispatcher.id INTO new_id;
    RETURN new_id;
END $$;

-- A heartbeat with the dispatcher's counters; false if its row is gone (removed by
-- maintenance after a long outage) or stopped: the dispatcher then registers again.
CREATE FUNCTION pgmb.dispatcher_beat(dispatcher_id bigint, in_flight integer, delivered bigint, failed bigint)
RETURNS boolean
LANGUAGE sql AS $$
    WITH beat AS (
        UPDATE pgmb_dispatcher d
        SET heartbeat_at = clock_timestamp(), in_flight = dispatcher_beat.in_flight,
            delivered = dispatcher_beat.delivered, failed = dispatcher_beat.failed
        WHERE d.id = dispatcher_id AND d.stopped_at IS NULL
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM beat)
$$;

-- A graceful exit: the last counters, nothing in flight; false if there was no such row.
CREATE FUNCTION pgmb.dispatcher_stop(dispatcher_id bigint, delivered bigint, failed bigint)
RETURNS boolean
LANGUAGE sql AS $$
    WITH stopped AS (
        UPDATE pgmb_dispatcher d
        SET stopped_at = clock_timestamp(), heartbeat_at = clock_timestamp(), in_flight = 0,
            delivered = dispatcher_stop.delivered, failed = dispatcher_stop.failed
        WHERE d.id = dispatcher_id AND d.stopped_at IS NULL
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM stopped)
$$;

CREATE VIEW pgmb.dispatchers AS
SELECT d.id, d.kind, d.host, d.pid, d.queues, d.started_at, d.heartbeat_at, d.stopped_at,
       pgmb.dispatcher_state(d.heartbeat_at, d.stopped_at) AS state,
       d.in_flight, d.delivered, d.failed
FROM pgmb_dispatcher d
ORDER BY d.started_at DESC, d.id DESC;

-- Housekeeping for the pg_cron path: expired leases, pg_cron's own run log, and the rows
-- of dispatchers stopped or gone for longer than `keep`.
CREATE OR REPLACE FUNCTION pgmb.maintenance(keep interval DEFAULT '1 day') RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    reclaimed integer := pgmb.reclaim_expired(10000);
BEGIN
    IF to_regclass('cron.job_run_details') IS NOT NULL THEN
        EXECUTE 'DELETE FROM cron.job_run_details WHERE end_time < now() - $1' USING keep;
    END IF;
    DELETE FROM pgmb_dispatcher d
    WHERE coalesce(d.stopped_at, d.heartbeat_at) < now() - keep
      AND pgmb.dispatcher_state(d.heartbeat_at, d.stopped_at) <> 'running';
    RETURN reclaimed;
END $$;

-- As in 0004, registering, beating every 5 s and marking itself stopped at the end.
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
