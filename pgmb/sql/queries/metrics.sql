-- Metrics for machines, as pgmb/metrics.py reads them: the functions of migration 0007.

-- name: queues
SELECT m.queue_name, m.queue_length, m.queue_visible_length, m.newest_msg_age_sec,
       m.oldest_msg_age_sec, m.total_messages, m.leased, m.retrying, m.dead_letters,
       m.delivered_last_hour, m.failed_last_hour, m.paused, m.scrape_time
FROM pgmb.metrics_all() AS m

-- name: queues_named
SELECT m.queue_name, m.queue_length, m.queue_visible_length, m.newest_msg_age_sec,
       m.oldest_msg_age_sec, m.total_messages, m.leased, m.retrying, m.dead_letters,
       m.delivered_last_hour, m.failed_last_hour, m.paused, m.scrape_time
FROM pgmb.metrics_all() AS m
WHERE m.queue_name = ANY(%(names)s)

-- name: queue
SELECT m.queue_name, m.queue_length, m.queue_visible_length, m.newest_msg_age_sec,
       m.oldest_msg_age_sec, m.total_messages, m.leased, m.retrying, m.dead_letters,
       m.delivered_last_hour, m.failed_last_hour, m.paused, m.scrape_time
FROM pgmb.metrics(%(queue)s) AS m

-- name: workers
SELECT w.worker_name, w.active, w.requests_last_hour, w.successes_last_hour, w.success_rate,
       w.p95_latency_ms, w.last_success_at, w.last_error_status, w.last_error, w.last_error_at,
       w.consecutive_failures, w.scrape_time
FROM pgmb.worker_metrics() AS w

-- name: workers_named
SELECT w.worker_name, w.active, w.requests_last_hour, w.successes_last_hour, w.success_rate,
       w.p95_latency_ms, w.last_success_at, w.last_error_status, w.last_error, w.last_error_at,
       w.consecutive_failures, w.scrape_time
FROM pgmb.worker_metrics() AS w
WHERE w.worker_name = ANY(%(names)s)
