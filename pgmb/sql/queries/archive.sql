-- The archive job (pgmb/pipeline/archive.py): runs in pgmb_archive_run. A run takes each
-- day partition old enough whole (pgmb.claim_history_day detaches it; pgmb_archive_day),
-- and claims the finished messages of the default and far partitions one by one in
-- pgmb_archive_item (pgmb.replay skips them). The driver runs these with psycopg; the reads
-- for Spark (messages_of_run, attempts_of_run, messages_of_day, attempts_of_day) become
-- JDBC subqueries with the run's id ({run}) or the day's tables ({messages}, {attempts})
-- filled in (pgmb.pipeline.archive).

-- name: lock_job
-- One archive job at a time: held by the job's connection until it ends (or dies).
SELECT pg_try_advisory_lock(pgmb.archive_lock_key('job'))

-- name: unfinished_runs
SELECT id, state, output
FROM pgmb_archive_run
WHERE state IN ('claiming', 'writing', 'written')
ORDER BY id

-- name: done_with_days
-- Done runs whose days are not dropped: finished by a job that knows no days (0.1.1's),
-- their Parquet committed.
SELECT DISTINCT d.run_id FROM pgmb_archive_day d JOIN pgmb_archive_run r ON r.id = d.run_id
WHERE r.state = 'done' AND d.dropped_at IS NULL
ORDER BY 1

-- name: start_run
-- The cutoff is the database's clock, as every created_at is.
INSERT INTO pgmb_archive_run (output, cutoff)
VALUES (%(output)s, now() - make_interval(secs => %(seconds)s))
RETURNING id, cutoff

-- name: adopt_days
-- The days a run that stopped before its Parquet was committed had taken: still detached,
-- seen by no one, they are this run's to write.
UPDATE pgmb_archive_day d SET run_id = %(run)s
FROM pgmb_archive_run r
WHERE r.id = d.run_id AND r.state = 'discarded' AND d.dropped_at IS NULL

-- name: days_to_claim
-- The days both history tables have a partition of, whose day ended before the cutoff,
-- oldest first.
SELECT h.day FROM pgmb.history_days() h
WHERE (h.day + 1)::timestamp AT TIME ZONE 'UTC' <= %(cutoff)s
GROUP BY h.day HAVING count(*) = 2
ORDER BY h.day

-- name: claim_day
-- NULL: the day's tables were busy (or gone); left for the next run.
SELECT pgmb.claim_history_day(%(run)s, %(day)s, %(cutoff)s)

-- name: days_of_run
SELECT day, message_table, attempt_table FROM pgmb_archive_day
WHERE run_id = %(run)s AND dropped_at IS NULL
ORDER BY day

-- name: count_day
SELECT (SELECT count(*) FROM {messages}), (SELECT count(*) FROM {attempts})

-- name: record_day_counts
UPDATE pgmb_archive_day SET messages = %(messages)s, attempts = %(attempts)s
WHERE run_id = %(run)s AND day = %(day)s

-- name: drop_day
-- Retention of a day whose Parquet is committed: its two tables dropped, no row deleted.
DROP TABLE IF EXISTS {messages}, {attempts}

-- name: mark_day_dropped
UPDATE pgmb_archive_day SET dropped_at = now()
WHERE run_id = %(run)s AND day = %(day)s

-- name: lock_claims
-- Taken by each claim batch: a pgmb.replay in progress commits its deliveries first, and
-- none starts until the batch's claims are visible to it (pgmb.replay, schema/deliveries.sql).
SELECT pg_advisory_xact_lock(pgmb.archive_lock_key('claim'))

-- name: claim
-- The next batch of finished messages of the default and far partitions, in id order after %(after)s (NULL: from the
-- start): no live delivery, no dead letter, published and last attempted before the
-- cutoff. Returns how many it claimed and the last id (where the next batch starts).
WITH claimed AS (
    INSERT INTO pgmb_archive_item (run_id, message_id)
    SELECT %(run)s, m.id
    -- Only the partitions no day holds: the days are taken whole (claim_day).
    FROM (SELECT id, created_at FROM pgmb_message_default
          UNION ALL
          SELECT id, created_at FROM pgmb_message_far) AS m
    WHERE (%(after)s::uuid IS NULL OR m.id > %(after)s::uuid)
      AND m.created_at < %(cutoff)s
      AND NOT EXISTS (SELECT FROM pgmb_delivery d WHERE d.message_id = m.id)
      AND NOT EXISTS (SELECT FROM pgmb_dead_letter x WHERE x.message_id = m.id)
      AND NOT EXISTS (SELECT FROM pgmb_attempt a
                      WHERE a.message_id = m.id AND a.created_at >= %(cutoff)s)
    ORDER BY m.id
    LIMIT %(limit)s
    RETURNING message_id
)
SELECT count(*), (SELECT c.message_id FROM claimed c ORDER BY c.message_id DESC LIMIT 1)
FROM claimed

-- name: run_bounds
-- The run's item ids, the range Spark's JDBC reads are partitioned on.
SELECT count(*), min(id), max(id) FROM pgmb_archive_item WHERE run_id = %(run)s

-- name: mark_writing
UPDATE pgmb_archive_run SET state = 'writing', messages = %(messages)s
WHERE id = %(run)s AND state = 'claiming'

-- name: run_counts
-- What the run's Parquet must hold: its messages and their attempts, as they are now.
SELECT (SELECT count(*) FROM pgmb_archive_item i JOIN pgmb_message m ON m.id = i.message_id
        WHERE i.run_id = %(run)s),
       (SELECT count(*) FROM pgmb_archive_item i JOIN pgmb_attempt a ON a.message_id = i.message_id
        WHERE i.run_id = %(run)s)

-- name: mark_written
-- From here on the run's rows may be deleted: its Parquet is committed.
UPDATE pgmb_archive_run
SET state = 'written', written_at = now(), messages = %(messages)s, attempts = %(attempts)s,
    files = %(files)s, bytes = %(bytes)s
WHERE id = %(run)s AND state = 'writing'

-- name: delete_batch
-- One short transaction: the run's next items, their messages and their attempts leave
-- together. Returns the items, messages and attempts deleted.
WITH batch AS (
    SELECT id, message_id FROM pgmb_archive_item
    WHERE run_id = %(run)s
    ORDER BY id
    LIMIT %(limit)s
), attempts AS (
    DELETE FROM pgmb_attempt a USING batch b WHERE a.message_id = b.message_id RETURNING 1
), messages AS (
    DELETE FROM pgmb_message m USING batch b WHERE m.id = b.message_id RETURNING 1
), items AS (
    DELETE FROM pgmb_archive_item i USING batch b WHERE i.id = b.id RETURNING 1
)
SELECT (SELECT count(*) FROM items), (SELECT count(*) FROM messages),
       (SELECT count(*) FROM attempts)

-- name: mark_done
UPDATE pgmb_archive_run SET state = 'done', finished_at = now()
WHERE id = %(run)s AND state IN ('claiming', 'written')

-- name: release_items
-- A discarded run frees its messages (they are archived again by a later run).
DELETE FROM pgmb_archive_item WHERE run_id = %(run)s

-- name: mark_discarded
UPDATE pgmb_archive_run SET state = 'discarded', finished_at = now()
WHERE id = %(run)s AND state IN ('claiming', 'writing')

-- name: messages_of_run
SELECT i.id AS item_id, m.id::text AS id, m.routing_key::text AS routing_key,
       m.body::text AS body, m.headers::text AS headers, m.created_at, m.available_at
FROM pgmb_archive_item i
JOIN pgmb_message m ON m.id = i.message_id
WHERE i.run_id = {run}

-- name: attempts_of_run
-- Each attempt with its queue's and worker's names as they are now (NULL once deleted)
-- and its message's publication time (latency from publish to outcome).
SELECT i.id AS item_id, a.id, a.message_id::text AS message_id, a.queue_id::text AS queue_id,
       q.name::text AS queue, w.name::text AS worker_name, a.attempt, a.outcome::text AS outcome,
       a.status_code, a.duration_ms, a.error, a.created_at, m.created_at AS published_at
FROM pgmb_archive_item i
JOIN pgmb_attempt a ON a.message_id = i.message_id
JOIN pgmb_message m ON m.id = i.message_id
LEFT JOIN pgmb_queue q ON q.id = a.queue_id
LEFT JOIN pgmb_worker w ON w.id = q.worker_id
WHERE i.run_id = {run}

-- name: messages_of_day
-- A day's messages, its detached table read whole.
SELECT m.id::text AS id, m.routing_key::text AS routing_key, m.body::text AS body,
       m.headers::text AS headers, m.created_at, m.available_at
FROM {messages} m

-- name: attempts_of_day
-- A day's attempts, as attempts_of_run reads them.
SELECT a.id, a.message_id::text AS message_id, a.queue_id::text AS queue_id,
       q.name::text AS queue, w.name::text AS worker_name, a.attempt, a.outcome::text AS outcome,
       a.status_code, a.duration_ms, a.error, a.created_at, m.created_at AS published_at
FROM {attempts} a
JOIN {messages} m ON m.id = a.message_id
LEFT JOIN pgmb_queue q ON q.id = a.queue_id
LEFT JOIN pgmb_worker w ON w.id = q.worker_id
