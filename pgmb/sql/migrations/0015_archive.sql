-- pgmb 0015: the Spark pipeline's archive job (pgmb.pipeline.archive). Its runs and the
-- messages each has claimed are the tables pgmb_archive_run and pgmb_archive_item (Django
-- models). A claimed message is on its way out of the database: its Parquet is being
-- written, or written and about to be deleted. Replaying it now would give the archive a
-- message that is live again, so pgmb.replay skips claimed messages, and a claim and a
-- replay take turns under an advisory lock.

-- The advisory lock keys of the archive: 'job' (one archive job at a time, held for its
-- run) and 'claim' (taken by each claim batch, and shared by pgmb.replay).
CREATE FUNCTION pgmb.archive_lock_key(kind text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('pgmb archive ' || kind, 0)
$$;

-- As in 0009, and a message claimed by an archive run gives nothing. The shared lock waits
-- for a claim batch in progress to commit; each statement of this function then reads the
-- database anew (READ COMMITTED), so a message is either claimed (and skipped here) or has
-- its new delivery before a claim looks at it (and is not claimed).
CREATE OR REPLACE FUNCTION pgmb.replay(message_ids uuid[], queue_names text[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(pgmb.archive_lock_key('claim'));
    INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at, created_at)
    SELECT acked.message_id, acked.queue_id, 'ready', 0, now(), now()
    FROM (
        SELECT DISTINCT a.message_id, a.queue_id
        FROM pgmb_attempt a
        WHERE a.message_id = ANY (message_ids) AND a.outcome = 'ack'
    ) AS acked
    JOIN pgmb_message m ON m.id = acked.message_id
    JOIN pgmb_queue q ON q.id = acked.queue_id
    WHERE (queue_names IS NULL OR q.name = ANY (queue_names))
      AND NOT EXISTS (SELECT FROM pgmb_dead_letter x
                      WHERE x.message_id = acked.message_id AND x.queue_id = acked.queue_id)
      AND NOT EXISTS (SELECT FROM pgmb_archive_item i WHERE i.message_id = acked.message_id)
    ORDER BY acked.message_id, acked.queue_id
    ON CONFLICT (message_id, queue_id) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM pg_notify('pgmb', '');
    END IF;
    RETURN n;
END $$;
