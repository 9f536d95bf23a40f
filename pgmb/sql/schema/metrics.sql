-- Metrics for monitoring (docs/sql-api.md): per queue and per worker, each in one query.

-- One queue's metrics; an unknown name is an error (42704), not an empty result.
CREATE OR REPLACE FUNCTION pgmb.metrics(queue_name text) RETURNS pgmb.queue_metrics
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

-- Per worker, over the requests of its queues (not 'unsent', 'ttl' or 'canceled' history
-- rows: no request was made, or an operator ended it): the last hour through the index on created_at, the last success through
-- pgmb_attempt_acked, the last error and the failures since the last success through a
-- look-back of at most 24 hours.
CREATE OR REPLACE FUNCTION pgmb.worker_metrics() RETURNS SETOF pgmb.worker_metrics
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
        WHERE a.created_at > now() - interval '1 hour' AND a.outcome NOT IN ('unsent', 'ttl', 'canceled')
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
        WHERE q.worker_id = w.id AND a.outcome NOT IN ('ack', 'unsent', 'ttl', 'canceled')
          AND a.created_at > now() - interval '24 hours'
        ORDER BY a.created_at DESC, a.id DESC LIMIT 1
    ) e ON true
    LEFT JOIN LATERAL (
        SELECT count(*) AS n
        FROM pgmb_attempt a JOIN pgmb_queue q ON q.id = a.queue_id
        WHERE q.worker_id = w.id AND a.outcome NOT IN ('ack', 'unsent', 'ttl', 'canceled')
          AND a.created_at > greatest(s.at, now() - interval '24 hours')
    ) f ON true
    ORDER BY w.name
$$;

-- Every queue's metrics, by name. An SQL function PostgreSQL inlines: a condition on
-- queue_name reaches the scan of pgmb_queue, and each queue's deliveries are read through
-- the partial index of its ready rows (pgmb_delivery_due); leased and waiting rows (few),
-- and the last hour's attempts, are read once for all queues. 'unsent' and 'ttl' history
-- rows (no request was made) and 'canceled' ones (an operator ended it) are not failures,
-- and an archived message is neither delivered nor failed.
CREATE OR REPLACE FUNCTION pgmb.metrics_all() RETURNS SETOF pgmb.queue_metrics
    LANGUAGE sql STABLE
    AS $$
    SELECT q.name::text,
           r.n + coalesce(l.n, 0) + coalesce(l.waiting, 0),
           r.due,
           extract(epoch FROM now() - greatest(r.newest, l.newest))::float8,
           extract(epoch FROM now() - r.oldest_due)::float8,
           r.n + coalesce(l.n, 0) + coalesce(l.waiting, 0) + x.n + a.n,
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
        SELECT d.queue_id, count(*) FILTER (WHERE d.state = 'leased') AS n,
               count(*) FILTER (WHERE d.state = 'waiting') AS waiting,
               max(d.created_at) AS newest
        FROM pgmb_delivery d WHERE d.state = 'leased' OR d.state = 'waiting' GROUP BY d.queue_id
    ) l ON l.queue_id = q.id
    LEFT JOIN (
        SELECT a.queue_id,
               count(*) FILTER (WHERE a.outcome = 'ack') AS delivered,
               count(*) FILTER (WHERE a.outcome NOT IN ('ack', 'unsent', 'archived', 'ttl', 'canceled')) AS failed
        FROM pgmb_attempt a WHERE a.created_at > now() - interval '1 hour' GROUP BY a.queue_id
    ) h ON h.queue_id = q.id
    ORDER BY q.name
$$;
