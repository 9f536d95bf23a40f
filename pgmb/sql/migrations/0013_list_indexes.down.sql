-- Reverse of 0013_list_indexes.
DROP INDEX IF EXISTS pgmb_dead_letter_created;
DROP STATISTICS IF EXISTS pgmb.attempt_outcome_status;
DROP INDEX IF EXISTS pgmb_attempt_failed;
DROP INDEX IF EXISTS pgmb_message_routing_key;
DROP INDEX IF EXISTS pgmb_message_created;
CREATE INDEX IF NOT EXISTS pgmb_delivery_due_plain
    ON pgmb_delivery (queue_id, available_at, id) WHERE state = 'ready';
DROP INDEX IF EXISTS pgmb_delivery_due;
ALTER INDEX pgmb_delivery_due_plain RENAME TO pgmb_delivery_due;
