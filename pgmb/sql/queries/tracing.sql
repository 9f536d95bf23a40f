-- Spans of the in-database loop's attempts, made from the history (pgmb/trace_export.py;
-- pgmb_attempt.indb in pgmb/sql/schema/tables.sql, pgmb.trace_export in indb.sql).

-- name: start
-- The export's row, made at the first run: from the beginning of the history (the epoch:
-- a finite time, which Python can read).
INSERT INTO pgmb.trace_export (recorded_at, attempt_id) VALUES ('epoch', 0)
ON CONFLICT (one) DO NOTHING

-- name: position
-- Where the export stands, locked until the batch commits (exporters take turns), and the
-- latest recorded time read this time: `lag` seconds ago, by the database's clock (the one
-- the history's created_at comes from), so that outcomes still being committed are left
-- for the next batch.
SELECT recorded_at, attempt_id, clock_timestamp() - make_interval(secs => %(lag)s) AS upto
FROM pgmb.trace_export FOR UPDATE

-- name: attempts
-- The loop's attempts after the position, in the order recorded, with their message's
-- headers (NULL once the message left the history) and their queue's name.
SELECT a.id, a.created_at, a.message_id::text AS message_id, a.attempt, a.status_code,
       a.duration_ms, a.error, coalesce(q.name::text, a.queue_id::text) AS queue, m.headers
FROM pgmb_attempt a
LEFT JOIN pgmb_queue q ON q.id = a.queue_id
LEFT JOIN pgmb_message m ON m.id = a.message_id
WHERE a.indb AND a.created_at >= %(recorded_at)s AND a.created_at <= %(upto)s
  AND (a.created_at, a.id) > (%(recorded_at)s, %(attempt_id)s)
ORDER BY a.created_at, a.id
LIMIT %(batch)s

-- name: advance
UPDATE pgmb.trace_export SET recorded_at = %(recorded_at)s, attempt_id = %(attempt_id)s

-- name: pass
-- A batch short of its limit read everything recorded up to `upto`: the position moves
-- there, so that the next run does not read again the attempts it passed over (those of
-- pgmb_dispatch, untraced or not). Never back (a run with a longer lag).
UPDATE pgmb.trace_export SET recorded_at = %(upto)s, attempt_id = 9223372036854775807
WHERE (recorded_at, attempt_id) < (%(upto)s, 9223372036854775807)
