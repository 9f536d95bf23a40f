-- Running dispatchers register and heartbeat, so an operator sees them. Each dispatcher
-- (pgmb_dispatch, the in-database loop, or a pull consumer) has a row in pgmb_dispatcher
-- from its start; it beats every few seconds with its counters and marks itself stopped
-- on a graceful exit. One that stops beating without saying so (killed, its machine or
-- connection lost) is shown as gone once its last heartbeat is 60 s old. Stopped and gone
-- rows are removed by pgmb.maintenance() after a day. A dispatcher about to sleep marks
-- itself waiting, and publishers notify only while one waits (pgmb.wake_dispatchers).

-- A dispatcher's state: running, gone (no heartbeat for 60 s, as seen at `at`) or stopped.
CREATE OR REPLACE FUNCTION pgmb.dispatcher_state(heartbeat_at timestamptz, stopped_at timestamptz,
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
CREATE OR REPLACE FUNCTION pgmb.dispatcher_start(kind text, host text, pid integer, queues text[] DEFAULT NULL)
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
CREATE OR REPLACE FUNCTION pgmb.dispatcher_beat(dispatcher_id bigint, in_flight integer, delivered bigint, failed bigint)
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

-- Housekeeping for the pg_cron path: expired leases, expired deliveries (pgmb.expire),
-- pg_cron's own run log, the rows
-- of dispatchers stopped or gone for longer than `keep`, expired retiring secrets, and
-- the history's days ahead (pgmb.premake_history, history.sql).
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
    PERFORM pgmb.expire(10000);
    PERFORM pgmb.forget_expired_secrets();
    PERFORM pgmb.premake_history();
    RETURN reclaimed;
END $$;

-- A dispatcher found nothing to claim and is about to wait: mark it waiting. True once no
-- message insert is in flight, after which every publisher sees the mark; false if one
-- is (the caller claims again shortly and calls this again before it sleeps for long).
CREATE OR REPLACE FUNCTION pgmb.dispatcher_idle(dispatcher_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pgmb_dispatcher d SET waiting = true WHERE d.id = dispatcher_id AND d.waiting IS NOT true;
    BEGIN
        -- The parent only: every publish takes it, and its partitions would each cost a lock.
        LOCK TABLE ONLY pgmb_message IN SHARE MODE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    RETURN true;
END $$;

-- A dispatcher's claim came back full: it will claim again without being woken.
CREATE OR REPLACE FUNCTION pgmb.dispatcher_busy(dispatcher_id bigint) RETURNS void
LANGUAGE sql AS $$
    UPDATE pgmb_dispatcher d SET waiting = false WHERE d.id = dispatcher_id AND d.waiting IS NOT false
$$;

-- A graceful exit: the last counters, nothing in flight, not waiting; false if there was
-- no such row.
CREATE OR REPLACE FUNCTION pgmb.dispatcher_stop(dispatcher_id bigint, delivered bigint, failed bigint)
RETURNS boolean
LANGUAGE sql AS $$
    WITH stopped AS (
        UPDATE pgmb_dispatcher d
        SET stopped_at = clock_timestamp(), heartbeat_at = clock_timestamp(), in_flight = 0,
            delivered = dispatcher_stop.delivered, failed = dispatcher_stop.failed,
            waiting = false
        WHERE d.id = dispatcher_id AND d.stopped_at IS NULL
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM stopped)
$$;

-- The registered dispatchers and pull consumers, newest first, with their state.
CREATE OR REPLACE VIEW pgmb.dispatchers AS
SELECT d.id, d.kind, d.host, d.pid, d.queues, d.started_at, d.heartbeat_at, d.stopped_at,
       pgmb.dispatcher_state(d.heartbeat_at, d.stopped_at) AS state,
       d.in_flight, d.delivered, d.failed
FROM pgmb_dispatcher d
ORDER BY d.started_at DESC, d.id DESC;
