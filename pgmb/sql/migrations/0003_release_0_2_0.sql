-- Migration 0003_release_0_2_0 (pgmb 0.2.0): what changed in pgmb/sql/schema/ since 0.1.1,
-- written by hand, by concern. Every object here is also in pgmb/sql/schema/, which stays
-- the source to read; tests/migrations proves both build the same catalog. 0.1.1's
-- dispatchers keep running while this applies: a function they call keeps its arguments
-- and result (a changed one gets a new name beside it; CONTRIBUTING.md, Migrations).

-- ==== Pull: history when asked, reads and deletes ====

-- Only a pull queue may keep no history (the column is Django's AddField, before this).
ALTER TABLE pgmb_queue
    ADD CONSTRAINT pgmb_queue_history_pull_only CHECK (keep_history OR worker_id IS NULL);

-- pgmb.create, and whether the queue keeps its history (pgmb_queue.keep_history, on by
-- default): off, a pull queue's pgmb.delete and pgmb.pop write no 'ack' row
-- (docs/decisions/0063-pull-queues-without-history.md). Only a pull queue may turn it off.
CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, max_retries integer, worker_id uuid,
                                       keep_history boolean)
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
    PERFORM pgmb.check_keep_history($1, $4, $5);
    INSERT INTO pgmb_queue (name, binding_key, pattern, worker_id, max_retries, keep_history)
    VALUES ($1, $2, '', $4, $3, $5)  -- "create" is a keyword, so no create.name
    RETURNING id INTO new_id;
    RETURN new_id;
END $$;

-- Turns a queue's history on or off (see pgmb.create above); returns the setting as it was.
-- Takes effect for the deletes that start after it commits.
CREATE OR REPLACE FUNCTION pgmb.set_keep_history(queue_name text, keep_history boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    worker uuid;
    was boolean;
BEGIN
    SELECT q.worker_id, q.keep_history INTO worker, was FROM pgmb_queue q WHERE q.name = queue_name
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue % does not exist', quote_literal(queue_name) USING ERRCODE = 'undefined_object';
    END IF;
    PERFORM pgmb.check_keep_history(queue_name, worker, keep_history);
    UPDATE pgmb_queue q SET keep_history = set_keep_history.keep_history
    WHERE q.name = queue_name AND q.keep_history IS DISTINCT FROM set_keep_history.keep_history;
    RETURN was;
END $$;

-- The rule of the constraint pgmb_queue_history_pull_only, with its own message.
CREATE OR REPLACE FUNCTION pgmb.check_keep_history(queue_name text, worker_id uuid, keep_history boolean)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF keep_history IS NULL THEN
        RAISE EXCEPTION 'invalid keep_history NULL for queue %: it must be true or false', quote_literal(queue_name)
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT keep_history AND worker_id IS NOT NULL THEN
        RAISE EXCEPTION 'queue % has a worker: only a pull queue may keep no history', quote_literal(queue_name)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A push queue''s history is what its delivered counts, replay and the worker''s health read.';
    END IF;
END $$;

-- Creates a queue; the documented argument order: (name, binding_key, max_retries,
-- worker_id). worker_id NULL makes a pull queue; an unknown worker id is an error.
-- Returns the queue's id. It keeps its history (the five-argument pgmb.create above).
CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, max_retries integer, worker_id uuid)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT pgmb.create(name, binding_key, max_retries, worker_id, true) $$;

-- Settles read deliveries of one pull queue: deleted from the hot table, one history row
-- each with outcome ('ack' or 'archived'). Returns the ids settled. Ids of another queue
-- are an error; as it is raised after the delete, the delete is undone with the statement,
-- and the common case pays no second look-up. A queue that keeps no history (its
-- keep_history off) writes no 'ack' row: its delete only deletes, as PGMQ's does; an
-- archive is always recorded, as it is the only trace of an archived message
-- (docs/decisions/0063-pull-queues-without-history.md).
CREATE OR REPLACE FUNCTION pgmb.settle_reads(queue_name text, delivery_ids bigint[], outcome text)
RETURNS SETOF bigint LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
AS $$
DECLARE
    q record;
    done bigint[];
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    IF outcome = 'ack' AND NOT (SELECT qu.keep_history FROM pgmb_queue qu WHERE qu.id = q.id) THEN
        WITH gone AS (
            DELETE FROM pgmb_delivery d
            WHERE d.id = ANY (delivery_ids) AND d.queue_id = q.id
            RETURNING d.id
        )
        SELECT array_agg(g.id) INTO done FROM gone g;
    ELSE
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
    END IF;
    IF delivery_ids IS NULL OR coalesce(cardinality(done), 0) < cardinality(delivery_ids) THEN
        PERFORM pgmb.check_pull_ids(queue_name, q.id, delivery_ids);
    END IF;
    RETURN QUERY SELECT unnest(done);
END $$;

-- Closed, as every function of pgmb's but the reviewed list (access.sql).
REVOKE EXECUTE ON FUNCTION pgmb.create(text, text, integer, uuid, boolean),
    pgmb.set_keep_history(text, boolean), pgmb.check_keep_history(text, uuid, boolean) FROM PUBLIC;
