-- The pipeline's publish job (pgmb/pipeline/publish_rows.py), run by Spark's executors: each
-- batch is COPYed into a temporary table, then moved into pgmb_message by the same routed
-- insert as send_batch in publish.sql (the routing trigger creates the deliveries), made
-- idempotent by message id. COPY costs the executors ~2 us of CPU per row where unnest's
-- arrays cost ~40 (docs/benchmarks.md, "Pipeline").

-- name: create_staging
-- Per connection: COPY fills it, insert_staged empties it into pgmb_message.
CREATE TEMPORARY TABLE pgmb_publish_staging (
    id uuid, routing_key text, body jsonb, headers jsonb, at timestamptz, seconds float8
) ON COMMIT DELETE ROWS

-- name: copy_staging
COPY pgmb_publish_staging (id, routing_key, body, headers, at, seconds) FROM STDIN

-- name: insert_staged
-- A message whose id is already stored is skipped: ON CONFLICT DO NOTHING leaves it out of
-- the statement's transition table too, so the routing trigger gives it no second delivery
-- (tests/pipeline/test_publish.py proves it). Ids in order: two batches holding the same
-- ids take their locks in the same order and cannot deadlock. A missing id is generated,
-- as pgmb_message.id's default does.
-- Returns how many rows of each routing key were inserted.
WITH inserted AS (
    INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at)
    SELECT coalesce(id, pgmb.uuid_v7()), routing_key, body, headers, now(),
           greatest(now(), coalesce(at, now() + coalesce(seconds, 0) * interval '1 second'))
    FROM pgmb_publish_staging
    ORDER BY id
    ON CONFLICT (id) DO NOTHING
    RETURNING routing_key
)
SELECT routing_key, count(*) FROM inserted GROUP BY routing_key

-- name: queues
-- The routing rules at the start of a run, to count the deliveries of what is published.
SELECT pattern FROM pgmb_queue
