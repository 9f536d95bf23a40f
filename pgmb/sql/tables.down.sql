DROP INDEX IF EXISTS pgmb_queue_view_base;
ALTER TABLE pgmb_worker
    DROP CONSTRAINT IF EXISTS pgmb_worker_rps_positive,
    DROP CONSTRAINT IF EXISTS pgmb_worker_timeout_positive;
ALTER TABLE pgmb_queue
    DROP CONSTRAINT IF EXISTS pgmb_queue_retries_not_negative,
    DROP CONSTRAINT IF EXISTS pgmb_queue_backoff_valid,
    DROP CONSTRAINT IF EXISTS pgmb_queue_lease_positive;
ALTER TABLE pgmb_message
    DROP CONSTRAINT IF EXISTS pgmb_message_routing_key_valid,
    DROP CONSTRAINT IF EXISTS pgmb_message_headers_object;
ALTER TABLE pgmb_delivery DROP CONSTRAINT IF EXISTS pgmb_delivery_state_valid;
