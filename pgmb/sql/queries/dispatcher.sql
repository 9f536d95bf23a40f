-- What the external dispatcher runs: thin calls into the state machine (delivery.sql).

-- name: claim
-- Ids the dispatcher only passes on come as text, and empty headers as NULL: parsing a uuid
-- or a JSON object costs the Python side more than the server. The lease's length tells it
-- how long a claimed row may wait for a free slot.
SELECT c.delivery_id, c.lease_id, c.attempt, c.queue, c.message_id::text, c.routing_key,
       c.body, nullif(c.headers, '{}'::jsonb) AS headers, c.worker_id::text, c.endpoint,
       c.timeout, c.secret, c.rps, c.lease_seconds
FROM pgmb.claim(%s, %s, %s) AS c

-- name: claims_session
-- The claims connection (claim, release, reclaim) does not wait for the WAL flush at
-- commit (measured: a claim of 1 row 1.0 -> 0.6 ms, of 64 rows 4.0 -> 2.4 ms). A server
-- crash can only set its work back: a claim lost with it is a lease that never was (the
-- delivery is claimable again, as after an expiry; at-least-once holds), a lost reclaim is
-- done again, a lost release leaves the lease to expire. Outcomes (ack, fail) go through
-- the other connection and stay durable.
SET synchronous_commit = off

-- name: ack
SELECT pgmb.ack(%s, %s, %s)

-- name: fail
SELECT pgmb.fail(%s, %s, %s, %s, %s, %s)

-- name: release
SELECT pgmb.release(%s, %s)

-- name: reclaim
SELECT pgmb.reclaim_expired(1000)

-- name: next_wakeup
SELECT pgmb.next_wakeup(%s)

-- name: busy
SELECT pgmb.busy(%s)

-- name: listen
LISTEN pgmb
