-- Metrics for machines, as pgmb/metrics.py reads them: the functions of schema/metrics.sql.
-- A queue's keep_history comes along: without history its deletes are not counted.

-- name: queues
SELECT m.queue_name, m.queue_length, m.queue_visible_length, m.newest_msg_age_sec,
       m.oldest_msg_age_sec, m.total_messages, m.leased, m.retrying, m.dead_letters,
       m.delivered_last_hour, m.failed_last_hour, m.paused, m.scrape_time,
       (SELECT q.keep_history FROM pgmb_queue q WHERE q.name = m.queue_name) AS keeps_history
FROM pgmb.metrics_all() AS m

-- name: queues_named
SELECT m.queue_name, m.queue_length, m.queue_visible_length, m.newest_msg_age_sec,
       m.oldest_msg_age_sec, m.total_messages, m.leased, m.retrying, m.dead_letters,
       m.delivered_last_hour, m.failed_last_hour, m.paused, m.scrape_time,
       (SELECT q.keep_history FROM pgmb_queue q WHERE q.name = m.queue_name) AS keeps_history
FROM pgmb.metrics_all() AS m
WHERE m.queue_name = ANY(%(names)s)

-- name: queue
SELECT m.queue_name, m.queue_length, m.queue_visible_length, m.newest_msg_age_sec,
       m.oldest_msg_age_sec, m.total_messages, m.leased, m.retrying, m.dead_letters,
       m.delivered_last_hour, m.failed_last_hour, m.paused, m.scrape_time,
       (SELECT q.keep_history FROM pgmb_queue q WHERE q.name = m.queue_name) AS keeps_history
FROM pgmb.metrics(%(queue)s) AS m

-- name: workers
-- With each worker's circuit breaker (schema/breakers.sql), read from its row in the same
-- statement: 'off' when neither limit is set.
SELECT w.worker_name, w.active, w.requests_last_hour, w.successes_last_hour, w.success_rate,
       w.p95_latency_ms, w.last_success_at, w.last_error_status, w.last_error, w.last_error_at,
       w.consecutive_failures, w.scrape_time,
       CASE WHEN b.watched THEN b.breaker_state ELSE 'off' END AS breaker_state,
       CASE WHEN b.watched THEN b.breaker_reason ELSE '' END AS breaker_reason,
       CASE WHEN b.watched THEN b.breaker_since END AS breaker_since,
       CASE WHEN b.watched THEN b.breaker_until END AS breaker_until
FROM pgmb.worker_metrics() AS w
JOIN (SELECT wk.name, wk.breaker_state::text, wk.breaker_reason, wk.breaker_since, wk.breaker_until,
             coalesce(wk.breaker_failures, 0) > 0 OR wk.breaker_rate IS NOT NULL AS watched
      FROM pgmb_worker wk) AS b ON b.name = w.worker_name
ORDER BY w.worker_name

-- name: workers_named
SELECT w.worker_name, w.active, w.requests_last_hour, w.successes_last_hour, w.success_rate,
       w.p95_latency_ms, w.last_success_at, w.last_error_status, w.last_error, w.last_error_at,
       w.consecutive_failures, w.scrape_time,
       CASE WHEN b.watched THEN b.breaker_state ELSE 'off' END AS breaker_state,
       CASE WHEN b.watched THEN b.breaker_reason ELSE '' END AS breaker_reason,
       CASE WHEN b.watched THEN b.breaker_since END AS breaker_since,
       CASE WHEN b.watched THEN b.breaker_until END AS breaker_until
FROM pgmb.worker_metrics() AS w
JOIN (SELECT wk.name, wk.breaker_state::text, wk.breaker_reason, wk.breaker_since, wk.breaker_until,
             coalesce(wk.breaker_failures, 0) > 0 OR wk.breaker_rate IS NOT NULL AS watched
      FROM pgmb_worker wk) AS b ON b.name = w.worker_name
WHERE w.worker_name = ANY(%(names)s)
ORDER BY w.worker_name
