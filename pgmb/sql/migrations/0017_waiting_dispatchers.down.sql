-- Reverse of 0017_waiting_dispatchers: dispatcher_stop as 0008 left it. Django puts the
-- routing trigger back (NOTIFY on every publishing transaction) before this runs, and
-- drops the column pgmb_dispatcher.waiting after it.
CREATE OR REPLACE FUNCTION pgmb.dispatcher_stop(dispatcher_id bigint, delivered bigint, failed bigint)
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
DROP FUNCTION pgmb.dispatcher_busy(bigint);
DROP FUNCTION pgmb.dispatcher_idle(bigint);
DROP FUNCTION pgmb.wake_dispatchers();
