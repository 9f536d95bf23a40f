-- Fair shares per key (schema/fairness.sql), as pgmb/fairness.py calls them.

-- name: header
SELECT pgmb.fairness(queue_name => %(queue)s, header => %(header)s)

-- name: key
SELECT pgmb.fair_key(queue_name => %(queue)s, key => %(key)s, weight => %(weight)s,
                     max_in_flight => %(max_in_flight)s, rps => %(rps)s)

-- name: keys
-- A queue's fairness header and its keys in turn order (the next served first).
SELECT q.fairness_header, k.key, k.weight, k.max_in_flight, k.rps, k.served_at
FROM pgmb_queue q
LEFT JOIN pgmb.fair_key k ON k.queue_id = q.id
WHERE q.name = %(queue)s
ORDER BY k.served_at NULLS FIRST, k.key
