-- What the external dispatcher runs: thin calls into the state machine (delivery.sql).

-- name: claim
SELECT delivery_id, lease_id, attempt, queue, message_id, routing_key, body, headers,
       worker_id, endpoint, timeout, secret, rps
FROM pgmb.claim(%s, %s, %s)

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
