-- pgmb 0017: publishers NOTIFY only while some dispatcher waits for one.
--
-- Committing a transaction that notified takes a cluster-wide lock held through the WAL
-- flush, which serialised concurrent publishers (4 sessions: 9,622 single-message commits
-- a second without NOTIFY, 5,309 with it). A dispatcher that is busy claims again anyway;
-- only one that found nothing and waits needs the wake-up. A dispatcher marks its row
-- `waiting` when a claim comes back short and clears it when a claim comes back full, so
-- the row changes once per idle or busy spell, not per message. A dispatcher that never
-- said either (NULL: one older than this migration, still running during an upgrade) is
-- woken as before; the in-database loop does not listen and is never counted.
--
-- No lost wake-up. A dispatcher going idle sets the mark and, in the same transaction,
-- takes SHARE on pgmb_message without waiting (pgmb.dispatcher_idle), then claims once more
-- before it sleeps. The lock is granted only if no transaction holds ROW EXCLUSIVE on the
-- table, i.e. none has inserted a message and not yet finished; those that had are
-- committed (the last claim sees their messages) or rolled back. Any later publisher takes
-- ROW EXCLUSIVE after the dispatcher's commit, and its check, a new snapshot under READ
-- COMMITTED, sees the mark. If the lock is not granted the dispatcher tries again shortly.
-- Under REPEATABLE READ or SERIALIZABLE the check would read the transaction's first
-- snapshot, so such publishers always notify.

-- The column pgmb_dispatcher.waiting comes from Django's AddField just before this file.

-- Called by the routing trigger after a statement that created deliveries.
CREATE FUNCTION pgmb.wake_dispatchers() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('pgmb.notify', true), '') = 'off' THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed'
       OR EXISTS (SELECT FROM pgmb_dispatcher d
                  WHERE d.kind = 'external' AND d.waiting IS NOT false
                    -- A killed dispatcher's mark would make publishers notify for ever.
                    AND pgmb.dispatcher_state(d.heartbeat_at, d.stopped_at) = 'running') THEN
        PERFORM pg_notify('pgmb', '');
    END IF;
END $$;

-- A dispatcher found nothing to claim and is about to wait: mark it waiting. True once no
-- message insert is in flight, after which every publisher sees the mark; false if one
-- is (the caller claims again shortly and calls this again before it sleeps for long).
CREATE FUNCTION pgmb.dispatcher_idle(dispatcher_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pgmb_dispatcher d SET waiting = true WHERE d.id = dispatcher_id AND d.waiting IS NOT true;
    BEGIN
        LOCK TABLE pgmb_message IN SHARE MODE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    RETURN true;
END $$;

-- A dispatcher's claim came back full: it will claim again without being woken.
CREATE FUNCTION pgmb.dispatcher_busy(dispatcher_id bigint) RETURNS void
LANGUAGE sql AS $$
    UPDATE pgmb_dispatcher d SET waiting = false WHERE d.id = dispatcher_id AND d.waiting IS NOT false
$$;

-- A graceful exit is not waiting any more: as in 0008, and the mark cleared.
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
