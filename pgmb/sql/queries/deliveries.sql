-- The delivery state machine as pgmb/deliveries.py calls it: one statement per
-- transition, with named parameters. The functions themselves live in schema pgmb.

-- name: claim
-- Ids the dispatcher only passes on come as text, and empty headers as NULL: parsing a uuid
-- or a JSON object costs the Python side more than the server.
SELECT c.delivery_id, c.lease_id, c.attempt, c.max_attempts, c.queue,
       c.message_id::text AS message_id, c.routing_key, c.body,
       nullif(c.headers, '{}'::jsonb) AS headers, c.worker_id::text AS worker_id, c.endpoint,
       c.timeout, c.secret, c.rps, c.lease_seconds
FROM pgmb.claim(queue_names => %(queues)s, max_count => %(limit)s) AS c

-- name: ack
SELECT pgmb.ack(delivery_ids => %(ids)s, statuses => %(statuses)s, durations_ms => %(durations_ms)s)

-- name: fail
SELECT pgmb.fail(delivery_ids => %(ids)s, lease_ids => %(lease_ids)s, statuses => %(statuses)s,
                 errors => %(errors)s, retry_after => %(retry_after)s, durations_ms => %(durations_ms)s)

-- name: release
SELECT pgmb.release(delivery_ids => %(ids)s, lease_ids => %(lease_ids)s)

-- name: reclaim_expired
SELECT pgmb.reclaim_expired(max_count => %(limit)s)

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
