-- The dashboard's time series (pgmb/dashboard_series.py): one statement per range.

-- name: live_minutes
-- The last hour, minute by minute: one row per minute from the one holding now() - 1 hour
-- to the one holding now() (61 rows; empty minutes are zeros), for the queues chosen by
-- name or by worker (NULL: every queue). Attempts count from now() - 1 hour, as the
-- metrics' "last hour" does, so each column's sum is the figure of the queue and worker
-- lists. Every table is read through an index on its time column or its queue:
--   attempts   pgmb_attempt_created (the hour), then per finished delivery
--              pgmb_attempt_message_queue (its earlier attempts) and pgmb_message_pkey;
--   live       pgmb_delivery_due per chosen queue (ready rows), pgmb_delivery_leased;
--   messages   pgmb_message_created (the hour), then the indexes that lead with
--              message_id (pgmb.unrouted's test).
WITH bounds AS NOT MATERIALIZED (
    -- Inlined where it is used: the planner then sees now() and estimates each bound.
    SELECT now() - interval '1 hour' AS since,
           date_trunc('minute', now() - interval '1 hour') AS first,
           date_trunc('minute', now()) AS last
), minutes AS (
    SELECT m.at FROM bounds b, generate_series(b.first, b.last, interval '1 minute') AS m(at)
), chosen AS (
    -- Pull queues (no worker) count too, unless a worker is chosen.
    SELECT q.id FROM pgmb_queue q LEFT JOIN pgmb_worker w ON w.id = q.worker_id
    WHERE (%(queue)s::text IS NULL OR q.name = %(queue)s::text)
      AND (%(worker)s::text IS NULL OR w.name = %(worker)s::text)
), recent AS MATERIALIZED (
    -- An attempt written after this transaction's now() (clock_timestamp()) counts in
    -- the last minute.
    SELECT a.id, a.message_id, a.queue_id, a.attempt, a.outcome, a.duration_ms, a.created_at,
           least(date_trunc('minute', a.created_at), b.last) AS at
    FROM pgmb_attempt a, bounds b
    WHERE a.created_at > b.since AND a.queue_id IN (SELECT c.id FROM chosen c)
), outcomes AS (
    SELECT r.at,
           count(*) FILTER (WHERE r.outcome = 'ack') AS delivered,
           count(*) FILTER (WHERE r.outcome NOT IN ('ack', 'unsent', 'archived', 'ttl', 'canceled')) AS failed,
           count(*) FILTER (WHERE r.outcome = 'dead') AS dead_lettered,
           -- Deliveries whose time to live ran out unposted (pgmb.expire): no attempt.
           count(*) FILTER (WHERE r.outcome = 'ttl') AS expired_ttl,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY r.duration_ms) AS latency_p50_ms,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY r.duration_ms) AS latency_p95_ms
    FROM recent r GROUP BY r.at
), finished AS (
    -- Deliveries that left the queue within the hour (acknowledged, dead-lettered or
    -- expired by their time to live), and
    -- when they had entered it: routing copies the message's time to its first delivery;
    -- a later one (requeued, replayed: an earlier ack or dead attempt exists) is taken to
    -- have entered at its first attempt, the creation of a delivery being kept nowhere
    -- once it has left.
    SELECT r.at AS left_at,
           least(greatest(date_trunc('minute', coalesce(
               CASE WHEN NOT e.again
                    THEN (SELECT m.created_at FROM pgmb_message m WHERE m.id = r.message_id)
               END,
               e.first_try, r.created_at)), b.first), b.last) AS entered_at
    FROM recent r
    CROSS JOIN bounds b
    CROSS JOIN LATERAL (
        SELECT coalesce(bool_or(p.outcome IN ('ack', 'dead', 'ttl') AND p.id <> r.id), false) AS again,
               max(p.created_at) FILTER (WHERE p.attempt = 1) AS first_try
        FROM pgmb_attempt p
        WHERE p.message_id = r.message_id AND p.queue_id = r.queue_id
          AND p.created_at <= r.created_at
    ) e
    WHERE r.outcome IN ('ack', 'dead', 'ttl')
), depth_changes AS (
    -- Depth at the end of a minute = live deliveries that had entered by then + finished
    -- ones that had entered and not yet left: a running sum of these changes.
    SELECT least(greatest(date_trunc('minute', d.created_at), b.first), b.last) AS at,
           count(*) AS n
    FROM bounds b, chosen c
    JOIN pgmb_delivery d ON d.queue_id = c.id AND d.state = 'ready'
    GROUP BY 1
    UNION ALL
    SELECT least(greatest(date_trunc('minute', d.created_at), b.first), b.last), count(*)
    FROM bounds b, pgmb_delivery d
    WHERE d.state = 'leased' AND d.queue_id IN (SELECT c.id FROM chosen c)
    GROUP BY 1
    UNION ALL
    SELECT f.entered_at, count(*) FROM finished f GROUP BY 1
    UNION ALL
    SELECT f.left_at, -count(*) FROM finished f GROUP BY 1
), depth AS (
    SELECT x.at, sum(x.n) AS n FROM depth_changes x GROUP BY x.at
), unrouted AS (
    -- Messages of every queue: routing found none for them (the `routed` column of the
    -- view pgmb.messages is false).
    SELECT least(date_trunc('minute', m.created_at), b.last) AS at, count(*) AS n
    FROM pgmb_message m, bounds b
    WHERE m.created_at > b.since
      AND NOT EXISTS (SELECT FROM pgmb_delivery d WHERE d.message_id = m.id)
      AND NOT EXISTS (SELECT FROM pgmb_dead_letter x WHERE x.message_id = m.id)
      -- An attempt comes after its message: one of the hour's messages has its attempts
      -- within the hour, and a hashed anti-join reads no older history than that.
      AND NOT EXISTS (SELECT FROM pgmb_attempt a
                      WHERE a.message_id = m.id AND a.created_at > b.since)
    GROUP BY 1
)
SELECT m.at,
       coalesce(o.delivered, 0) AS delivered,
       coalesce(o.failed, 0) AS failed,
       coalesce(o.dead_lettered, 0) AS dead_lettered,
       coalesce(o.expired_ttl, 0) AS expired_ttl,
       o.latency_p50_ms,
       o.latency_p95_ms,
       (sum(coalesce(d.n, 0)) OVER (ORDER BY m.at))::bigint AS depth,
       coalesce(u.n, 0) AS unrouted
FROM minutes m
LEFT JOIN outcomes o ON o.at = m.at
LEFT JOIN depth d ON d.at = m.at
LEFT JOIN unrouted u ON u.at = m.at
ORDER BY m.at
