-- pgmb 0007: metrics for machines. pgmb.metrics(queue_name), pgmb.metrics_all() (PGMQ's
-- fields adapted to pgmb, plus pgmb's own) and pgmb.worker_metrics(), read by pgmb.metrics
-- (the Prometheus endpoint and manage.py pgmb_stats). Read-only; every count goes through
-- an index (docs/decisions.md, "Metrics").

-- Acknowledged attempts per queue, for total_messages (an index-only count of one queue's
-- entries) and a worker's last success (its newest entry). On a big history, create it
-- beforehand with CREATE INDEX CONCURRENTLY under this name: this migration then keeps it.
CREATE INDEX IF NOT EXISTS pgmb_attempt_acked ON pgmb_attempt (queue_id, created_at)
    WHERE outcome = 'ack';

CREATE TYPE pgmb.queue_metrics AS (
    queue_name text,
    queue_length bigint,          -- live deliveries: ready, delayed and leased
    queue_visible_length bigint,  -- ready and due now
    newest_msg_age_sec float8,    -- since the newest live delivery was published (NULL: none)
    oldest_msg_age_sec float8,    -- since the oldest due one was published (NULL: none due)
    total_messages bigint,        -- deliveries the queue ever had: live + dead + acked
    leased bigint,
    retrying bigint,              -- attempts > 0, not leased
    dead_letters bigint,
    delivered_last_hour bigint,   -- acknowledged attempts in the last hour
    failed_last_hour bigint,      -- failed attempts (retry, dead, expired) in the last hour
    paused boolean,
    scrape_time timestamptz
);

CREATE TYPE pgmb.worker_metrics AS (
    worker_name text,
    active boolean,
    requests_last_hour bigint,
    successes_last_hour bigint,
    success_rate float8,          -- successes / requests of the last hour (NULL: no request)
    p95_latency_ms float8,        -- over the last hour's attempts with a duration
    last_success_at timestamptz,
    last_error_status integer,
    last_error text,
    last_error_at timestamptz,    -- the newest failure of the last 24 hours
    consecutive_failures bigint,  -- failures since the last success, within 24 hours
    scrape_time timestamptz
);

-- Every queue's metrics, by name. An SQL function PostgreSQL inlines: a condition on
-- queue_name reaches the scan of pgmb_queue, and each queue's deliveries are read through
-- the partial index of its ready rows (pgmb_delivery_due); leased rows (few: in flight),
-- and the last hour's attempts, are read once for all queues.
CREATE FUNCTION pgmb.metrics_all() RETURNS SETOF pgmb.queue_metrics
LANGUAGE sql STABLE AS $$
    SELECT q.name::text,
           r.n + coalesce(l.n, 0),
           r.due,
           extract(epoch FROM now() - greatest(r.newest, l.newest))::float8,
           extract(epoch FROM now() - r.oldest_due)::float8,
           r.n + coalesce(l.n, 0) + x.n + a.n,
           coalesce(l.n, 0),
           r.retrying,
           x.n,
           coalesce(h.delivered, 0),
           coalesce(h.failed, 0),
           q.paused,
           now()
    FROM pgmb_queue q
    CROSS JOIN LATERAL (
        SELECT count(*) AS n,
               count(*) FILTER (WHERE d.available_at <= now()) AS due,
               count(*) FILTER (WHERE d.attempts > 0) AS retrying,
               max(d.created_at) AS newest,
               min(d.created_at) FILTER (WHERE d.available_at <= now()) AS oldest_due
        FROM pgmb_delivery d WHERE d.queue_id = q.id AND d.state = 'ready'
    ) r
    CROSS JOIN LATERAL (SELECT count(*) AS n FROM pgmb_dead_letter x WHERE x.queue_id = q.id) x
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM pgmb_attempt a WHERE a.queue_id = q.id AND a.outcome = 'ack'
    ) a
    LEFT JOIN (
        SELECT d.queue_id, count(*) AS n, max(d.created_at) AS newest
        FROM pgmb_delivery d WHERE d.state = 'leased' GROUP BY d.queue_id
    ) l ON l.queue_id = q.id
    LEFT JOIN (
        SELECT a.queue_id,
               count(*) FILTER (WHERE a.outcome = 'ack') AS delivered,
               count(*) FILTER (WHERE a.outcome <> 'ack') AS failed
        FROM pgmb_attempt a WHERE a.created_at > now() - interval '1 hour' GROUP BY a.queue_id
    ) h ON h.queue_id = q.id
    ORDER BY q.name
$$;

-- One queue's metrics; an unknown name is an error (42704), not an empty result.
CREATE FUNCTION pgmb.metrics(queue_name text) RETURNS pgmb.queue_metrics
LANGUAGE plpgsql STABLE AS $$
DECLARE
    result pgmb.queue_metrics;
BEGIN
    SELECT * INTO result FROM pgmb.metrics_all() AS m WHERE m.queue_name = metrics.queue_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue % does not exist', quote_nullable(metrics.queue_name)
            USING ERRCODE = 'undefined_object',
                  HINT = 'SELECT name FROM pgmb_queue lists the queues; pgmb.metrics_all() gives them all.';
    END IF;
    RETURN result;
END $$;

-- Per worker, over the attempts of its queues: the last hour through the index on
-- created_at, the last success through pgmb_attempt_acked, the last error and the failures
-- since the last success through a look-back of at most 24 hours.
CREATE FUNCTION pgmb.worker_metrics() RETURNS SETOF pgmb.worker_metrics
LANGUAGE sql STABLE AS $$
    SELECT w.name::text,
           w.active,
           coalesce(h.requests, 0),
           coalesce(h.successes, 0),
           h.successes::float8 / nullif(h.requests, 0),
           h.p95,
           s.at,
           e.status_code,
           e.error,
           e.created_at,
           coalesce(f.n, 0),
           now()
    FROM pgmb_worker w
    LEFT JOIN (
        SELECT q.worker_id,
               count(*) AS requests,
               count(*) FILTER (WHERE a.outcome = 'ack') AS successes,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY a.duration_ms) AS p95
        FROM pgmb_attempt a JOIN pgmb_queue q ON q.id = a.queue_id
        WHERE a.created_at > now() - interval '1 hour'
        GROUP BY q.worker_id
    ) h ON h.worker_id = w.id
    LEFT JOIN LATERAL (
        SELECT max(a.created_at) AS at
        FROM pgmb_queue q
        CROSS JOIN LATERAL (
            SELECT a.created_at FROM pgmb_attempt a
            WHERE a.queue_id = q.id AND a.outcome = 'ack'
            ORDER BY a.created_at DESC LIMIT 1
        ) a
        WHERE q.worker_id = w.id
    ) s ON true
    LEFT JOIN LATERAL (
        SELECT a.status_code, a.error, a.created_at
        FROM pgmb_attempt a JOIN pgmb_queue q ON q.id = a.queue_id
        WHERE q.worker_id = w.id AND a.outcome <> 'ack'
          AND a.created_at > now() - interval '24 hours'
        ORDER BY a.created_at DESC, a.id DESC LIMIT 1
    ) e ON true
    LEFT JOIN LATERAL (
        SELECT count(*) AS n
        FROM pgmb_attempt a JOIN pgmb_queue q ON q.id = a.queue_id
        WHERE q.worker_id = w.id AND a.outcome <> 'ack'
          AND a.created_at > greatest(s.at, now() - interval '24 hours')
    ) f ON true
    ORDER BY w.name
$$;
