-- Reverse of 0007_metrics.
DROP FUNCTION pgmb.worker_metrics();
DROP FUNCTION pgmb.metrics(text);
DROP FUNCTION pgmb.metrics_all();
DROP TYPE pgmb.worker_metrics;
DROP TYPE pgmb.queue_metrics;
DROP INDEX IF EXISTS pgmb_attempt_acked;
