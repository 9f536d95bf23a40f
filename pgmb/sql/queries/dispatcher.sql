-- Session statements of the external dispatcher's connections (pgmb/db/reconnecting.py).
-- Its state-machine calls are in deliveries.sql, through pgmb/deliveries.py.

-- name: claims_session
-- The claims connection (claim, release, reclaim) does not wait for the WAL flush at
-- commit (measured: a claim of 1 row 1.0 -> 0.6 ms, of 64 rows 4.0 -> 2.4 ms). A server
-- crash can only set its work back: a claim lost with it is a lease that never was (the
-- delivery is claimable again, as after an expiry; at-least-once holds), a lost reclaim is
-- done again, a lost release leaves the lease to expire. Outcomes (ack, fail) go through
-- the other connection and stay durable. Not set through a transaction pooler
-- (pgmb/db/pooler.py): it would stay with a server connection the pooler's other clients get.
SET synchronous_commit = off

-- name: listen
LISTEN pgmb
