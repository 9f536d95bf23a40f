-- Reverse of 0003_release_0_2_0: puts back 0.1.1's objects that it changed, by concern in
-- the same order as the forward file.

-- ==== Pull: history when asked, reads and deletes ====

-- Creates a queue; the documented argument order: (name, binding_key, max_retries,
-- worker_id). worker_id NULL makes a pull queue; an unknown worker id is an error.
-- Returns the queue's id.
CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, max_retries integer, worker_id uuid)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    new_id uuid;
BEGIN
    PERFORM pgmb.check_name('queue', $1);
    PERFORM pgmb.compile_binding($2);
    IF worker_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pgmb_worker w WHERE w.id = worker_id) THEN
        RAISE EXCEPTION 'unknown worker id %', worker_id
            USING ERRCODE = 'foreign_key_violation',
                  HINT = 'Register the worker first: SELECT pgmb.worker(name, endpoint, rps); or pass NULL for a pull queue.';
    END IF;
    INSERT INTO pgmb_queue (name, binding_key, pattern, worker_id, max_retries)
    VALUES ($1, $2, '', $4, $3)  -- "create" is a keyword, so no create.name
    RETURNING id INTO new_id;
    RETURN new_id;
END $$;

-- Settles read deliveries of one pull queue: deleted from the hot table, one history row
-- each with outcome ('ack' or 'archived'). Returns the ids settled. Ids of another queue
-- are an error; as it is raised after the delete, the delete is undone with the statement,
-- and the common case pays no second look-up.
CREATE OR REPLACE FUNCTION pgmb.settle_reads(queue_name text, delivery_ids bigint[], outcome text)
RETURNS SETOF bigint LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
AS $$
DECLARE
    q record;
    done bigint[];
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    WITH gone AS (
        DELETE FROM pgmb_delivery d
        WHERE d.id = ANY (delivery_ids) AND d.queue_id = q.id
        RETURNING d.id, d.message_id, d.queue_id, d.attempts
    ), history AS (
        INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
        SELECT g.message_id, g.queue_id, g.attempts, settle_reads.outcome, NULL, NULL, '', clock_timestamp()
        FROM gone g
    )
    SELECT array_agg(g.id) INTO done FROM gone g;
    IF delivery_ids IS NULL OR coalesce(cardinality(done), 0) < cardinality(delivery_ids) THEN
        PERFORM pgmb.check_pull_ids(queue_name, q.id, delivery_ids);
    END IF;
    RETURN QUERY SELECT unnest(done);
END $$;


DROP FUNCTION pgmb.set_keep_history(text, boolean);
DROP FUNCTION pgmb.create(text, text, integer, uuid, boolean);
DROP FUNCTION pgmb.check_keep_history(text, uuid, boolean);
ALTER TABLE pgmb_queue DROP CONSTRAINT pgmb_queue_history_pull_only;
