-- Hourly statistics (pgmb_statistics, its checks in schema/tables.sql): what the Spark
-- pipeline's stats job reads and writes (pgmb/pipeline/stats.py, with psycopg on the driver
-- and Spark's JDBC source), and what pgmb/hourly_stats.py reads for the dashboard.

-- name: attempts
-- The attempt history as the stats job reads it through JDBC, wrapped as a subquery
-- ("(…) AS attempts") that Spark splits into ranges of id. Names are looked up on the
-- driver (names); the publishing time comes along so that latencies need no second read.
SELECT a.id, a.message_id::text AS message_id, a.queue_id::text AS queue_id, a.attempt,
       a.outcome::text AS outcome, a.status_code, a.created_at, m.created_at AS published_at
FROM pgmb_attempt a
LEFT JOIN pgmb_message m ON m.id = a.message_id

-- name: bounds
-- The ids of the attempts since a time (NULL: all), to split the JDBC read into ranges
-- and to cut it at the newest attempt at the start of the run.
SELECT min(a.id) AS low, max(a.id) AS high, count(*) AS n
FROM pgmb_attempt a
WHERE a.created_at >= coalesce(%(since)s::timestamptz, '-infinity')

-- name: names
-- Each queue's name and its worker's: statistics are kept by name. A pull queue has no
-- worker (NULL: the job's "(unknown)").
SELECT q.id::text AS queue_id, q.name::text AS queue_name, w.name::text AS worker_name
FROM pgmb_queue q
LEFT JOIN pgmb_worker w ON w.id = q.worker_id

-- name: staging
-- The job's rows go here first (COPY), then into the table with one upsert.
CREATE TEMPORARY TABLE pgmb_statistics_staging ON COMMIT DROP AS
SELECT hour, queue_name, worker_name, attempts, delivered, failed, retried, dead_lettered, expired,
       attempts_per_message, latency_p50_ms, latency_p95_ms, latency_p99_ms, top_errors
FROM pgmb_statistics
WITH NO DATA

-- name: copy
COPY pgmb_statistics_staging (hour, queue_name, worker_name, attempts, delivered, failed, retried,
                              dead_lettered, expired, attempts_per_message, latency_p50_ms,
                              latency_p95_ms, latency_p99_ms, top_errors)
FROM STDIN

-- name: stale
-- A recomputed hour is replaced whole: its rows that the job did not compute again go
-- (a queue that changed workers, a queue whose attempts are gone). Hours the job found no
-- attempts in are left alone.
DELETE FROM pgmb_statistics s
WHERE s.hour IN (SELECT DISTINCT st.hour FROM pgmb_statistics_staging st)
  AND NOT EXISTS (SELECT FROM pgmb_statistics_staging st
                  WHERE st.hour = s.hour AND st.queue_name = s.queue_name
                    AND st.worker_name = s.worker_name)

-- name: upsert
-- The recomputed rows; a row whose figures did not change is not written again.
-- Returns one row per inserted or changed row.
INSERT INTO pgmb_statistics AS s (hour, queue_name, worker_name, attempts, delivered, failed,
                                  retried, dead_lettered, expired, attempts_per_message,
                                  latency_p50_ms, latency_p95_ms, latency_p99_ms, top_errors)
SELECT st.hour, st.queue_name, st.worker_name, st.attempts, st.delivered, st.failed, st.retried,
       st.dead_lettered, st.expired, st.attempts_per_message, st.latency_p50_ms,
       st.latency_p95_ms, st.latency_p99_ms, st.top_errors
FROM pgmb_statistics_staging st
ON CONFLICT (hour, queue_name, worker_name) DO UPDATE
SET attempts = excluded.attempts, delivered = excluded.delivered, failed = excluded.failed,
    retried = excluded.retried, dead_lettered = excluded.dead_lettered,
    expired = excluded.expired, attempts_per_message = excluded.attempts_per_message,
    latency_p50_ms = excluded.latency_p50_ms, latency_p95_ms = excluded.latency_p95_ms,
    latency_p99_ms = excluded.latency_p99_ms, top_errors = excluded.top_errors
WHERE (s.attempts, s.delivered, s.failed, s.retried, s.dead_lettered, s.expired,
       s.attempts_per_message, s.latency_p50_ms, s.latency_p95_ms, s.latency_p99_ms, s.top_errors)
      IS DISTINCT FROM
      (excluded.attempts, excluded.delivered, excluded.failed, excluded.retried,
       excluded.dead_lettered, excluded.expired, excluded.attempts_per_message,
       excluded.latency_p50_ms, excluded.latency_p95_ms, excluded.latency_p99_ms,
       excluded.top_errors)
RETURNING (s.xmax = 0) AS inserted

-- name: hourly
-- The hours that overlap [since, until), oldest first. Without a queue or a worker: each
-- hour's totals; a worker alone: its totals over its queues; a queue: that queue's rows
-- (one per worker it had in the hour; a worker narrows them).
SELECT s.hour, s.queue_name::text AS queue_name, s.worker_name::text AS worker_name,
       s.attempts, s.delivered, s.failed, s.retried, s.dead_lettered, s.expired,
       s.attempts_per_message, s.latency_p50_ms, s.latency_p95_ms, s.latency_p99_ms,
       s.top_errors
FROM pgmb_statistics s
WHERE s.hour > %(since)s::timestamptz - interval '1 hour' AND s.hour < %(until)s::timestamptz
  AND s.queue_name = coalesce(%(queue)s::text, '')
  AND CASE WHEN %(worker)s::text IS NOT NULL THEN s.worker_name = %(worker)s::text
           WHEN %(queue)s::text IS NULL THEN s.worker_name = ''
           ELSE true END
ORDER BY s.hour, s.worker_name

-- name: latest
-- The newest hour the statistics cover (NULL: none yet).
SELECT max(s.hour) AS hour FROM pgmb_statistics s

-- name: without_history
-- The queues that keep no history (keep_history off): their deleted messages left no
-- attempt to archive or count; the jobs name them in their reports.
SELECT q.name::text FROM pgmb_queue q WHERE NOT q.keep_history ORDER BY q.name
