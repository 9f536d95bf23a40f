-- pgmb 0013: indexes that keep the admin's lists fast on big tables (docs/decisions.md,
-- "Lists that stay fast"). Each serves a list's default ordering or a filter, so a page
-- reads its 100 rows (and the planner's estimate of the count) instead of a whole table.
--
-- Every index is created IF NOT EXISTS: on a big table, build it beforehand with CREATE
-- INDEX CONCURRENTLY under the same name (same columns, same WHERE) and the migration keeps
-- it instead of locking the table for the build.

-- The message list, newest first (created_at DESC, id DESC: the admin's tie-break), and
-- its date filter. Publishing pays one more index entry per message.
CREATE INDEX IF NOT EXISTS pgmb_message_created ON pgmb_message (created_at, id);

-- Searching by the beginning of a routing key (LIKE 'prefix%', case-sensitive) in every
-- list: the pattern operator class makes the prefix a range of the index whatever the
-- database's collation.
CREATE INDEX IF NOT EXISTS pgmb_message_routing_key
    ON pgmb_message (routing_key varchar_pattern_ops);

-- Failed attempts per queue, the counterpart of pgmb_attempt_acked (acknowledged ones):
-- together they hold every attempt by queue, so the attempt list filtered by a queue or a
-- worker reads that queue's entries. Alone it serves the failures: the status filter
-- checks status_code in the index (a class no failure has reads no row of the table).
-- Only failures pay for it.
CREATE INDEX IF NOT EXISTS pgmb_attempt_failed
    ON pgmb_attempt (queue_id, created_at, status_code) WHERE outcome <> 'ack';

-- An acknowledgement has a 2xx status, a failure has not: without the joint statistics
-- the planner multiplies the two conditions of "5xx failures" as if they were unrelated,
-- expects a tenth of the rows and counts them (or plans for a few) where there are many.
-- (In schema pgmb, with pgmb's other objects that are not Django's.)
CREATE STATISTICS IF NOT EXISTS pgmb.attempt_outcome_status (mcv)
    ON outcome, status_code FROM pgmb_attempt;

-- The dead-letter list, newest first, and its date filter.
CREATE INDEX IF NOT EXISTS pgmb_dead_letter_created ON pgmb_dead_letter (created_at, id);

-- The queue list's figures (pgmb.metrics_all()) count each queue's ready deliveries, the
-- due ones, the retrying ones and their newest and oldest publication: with attempts and
-- created_at in the claim index, that is an index-only scan of the queue's own entries.
-- Without them, a queue with a big backlog was read from the table, and the planner read
-- the whole table once per queue. The index keeps its name and its claim order; it is
-- built under another name first (build that one beforehand with CONCURRENTLY on a big
-- backlog), then takes the name.
CREATE INDEX IF NOT EXISTS pgmb_delivery_due_covering
    ON pgmb_delivery (queue_id, available_at, id) INCLUDE (attempts, created_at)
    WHERE state = 'ready';
DROP INDEX IF EXISTS pgmb_delivery_due;
ALTER INDEX pgmb_delivery_due_covering RENAME TO pgmb_delivery_due;
