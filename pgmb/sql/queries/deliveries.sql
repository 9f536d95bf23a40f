-- The delivery state machine as pgmb/deliveries.py calls it: one statement per
-- transition, with named parameters. The functions themselves live in schema pgmb.

-- name: claim
-- Ids the dispatcher only passes on come as text, and empty headers as NULL: parsing a uuid
-- or a JSON object costs the Python side more than the server.
SELECT c.delivery_id, c.lease_id, c.attempt, c.max_attempts, c.queue,
       c.message_id::text AS message_id, c.routing_key, c.body,
       nullif(c.headers, '{}'::jsonb) AS headers, c.worker_id::text AS worker_id, c.endpoint,
       c.timeout, c.secrets, c.rps, c.lease_seconds
FROM pgmb.claim(queue_names => %(queues)s, max_count => %(limit)s) AS c

-- name: ack
SELECT pgmb.ack(delivery_ids => %(ids)s, statuses => %(statuses)s, durations_ms => %(durations_ms)s)

-- name: fail
SELECT pgmb.fail(delivery_ids => %(ids)s, lease_ids => %(lease_ids)s, statuses => %(statuses)s,
                 errors => %(errors)s, retry_after => %(retry_after)s, durations_ms => %(durations_ms)s)

-- name: start
SELECT pgmb.start(delivery_ids => %(ids)s, lease_ids => %(lease_ids)s)

-- name: record
-- One write of the external dispatcher's outcomes: the start marks of requests still on
-- their way, acks and failures, in one statement (one round trip, one commit). A part
-- with nothing to write is not called; marks come last, so that a mark of a delivery whose
-- outcome is in the same write is not written at all.
SELECT CASE WHEN cardinality(%(ack_ids)s::bigint[]) > 0
            THEN pgmb.ack(delivery_ids => %(ack_ids)s, statuses => %(ack_statuses)s,
                          durations_ms => %(ack_durations_ms)s)
            ELSE 0 END AS acked,
       CASE WHEN cardinality(%(fail_ids)s::bigint[]) > 0
            THEN pgmb.fail(delivery_ids => %(fail_ids)s, lease_ids => %(fail_lease_ids)s,
                           statuses => %(fail_statuses)s, errors => %(fail_errors)s,
                           retry_after => %(fail_retry_after)s, durations_ms => %(fail_durations_ms)s)
            ELSE 0 END AS failed,
       CASE WHEN cardinality(%(start_ids)s::bigint[]) > 0
            THEN pgmb.start(delivery_ids => %(start_ids)s, lease_ids => %(start_lease_ids)s)
            ELSE 0 END AS started

-- name: release
SELECT pgmb.release(delivery_ids => %(ids)s, lease_ids => %(lease_ids)s)

-- name: reclaim_expired
SELECT pgmb.reclaim_expired(max_count => %(limit)s)

-- name: expire
SELECT pgmb.expire(max_count => %(limit)s)

-- name: requeue
SELECT pgmb.requeue(dead_letter_ids => %(ids)s)

-- name: requeue_queue
SELECT pgmb.requeue(queue_name => %(queue)s)

-- name: purge_dead_letters
SELECT pgmb.purge_dead_letters(dead_letter_ids => %(ids)s)

-- name: purge_queue_dead_letters
SELECT pgmb.purge_dead_letters(queue_name => %(queue)s)

-- name: next_wakeup
SELECT pgmb.next_wakeup(queue_names => %(queues)s)

-- name: busy
SELECT pgmb.busy(queue_names => %(queues)s)

-- name: replay
SELECT pgmb.replay(message_ids => %(ids)s::uuid[], queue_names => %(queues)s::text[])

-- name: cancel
SELECT c.removed, c.in_flight FROM pgmb.cancel(delivery_ids => %(ids)s::bigint[]) AS c

-- name: cancel_matching
SELECT c.removed, c.in_flight
FROM pgmb.cancel(queue_name => %(queue)s::text, routing_key_prefix => %(prefix)s::text,
                 older_than => %(older_than)s::interval) AS c

-- name: run_now
SELECT r.due, r.waiting FROM pgmb.run_now(delivery_ids => %(ids)s::bigint[]) AS r

-- name: run_now_matching
SELECT r.due, r.waiting
FROM pgmb.run_now(queue_name => %(queue)s::text, routing_key_prefix => %(prefix)s::text,
                  older_than => %(older_than)s::interval) AS r

-- name: backfill
SELECT pgmb.backfill(queue_name => %(queue)s, since => %(since)s::timestamptz,
                     until => %(until)s::timestamptz, max_count => %(limit)s)

-- name: recover
SELECT pgmb.recover(queue_name => %(queue)s, since => %(since)s::timestamptz,
                    until => coalesce(%(until)s::timestamptz, now()), max_count => %(limit)s)

-- name: fire_schedules
SELECT fired, next_in FROM pgmb.fire_due_schedules(max_count => %(limit)s)
