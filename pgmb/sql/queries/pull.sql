-- Pull queues as pgmb/pull.py calls them: one statement per function of schema pgmb
-- (schema/pull.sql), with named parameters.

-- name: read
SELECT * FROM pgmb.read(queue_name => %(queue)s, vt => %(vt)s::float8, qty => %(qty)s::integer,
                        filter => %(filter)s::jsonb)

-- name: read_with_poll
SELECT * FROM pgmb.read_with_poll(queue_name => %(queue)s, vt => %(vt)s::float8, qty => %(qty)s::integer,
                                  max_poll_seconds => %(max_poll_seconds)s::float8,
                                  poll_interval_ms => %(poll_interval_ms)s::integer,
                                  filter => %(filter)s::jsonb)

-- name: pop
SELECT * FROM pgmb.pop(queue_name => %(queue)s, qty => %(qty)s::integer)

-- name: set_vt
SELECT * FROM pgmb.set_vt(queue_name => %(queue)s, delivery_ids => %(ids)s::bigint[], vt => %(vt)s::float8)

-- name: delete
SELECT array(SELECT pgmb.delete(queue_name => %(queue)s, delivery_ids => %(ids)s::bigint[]))

-- name: archive
SELECT array(SELECT pgmb.archive(queue_name => %(queue)s, delivery_ids => %(ids)s::bigint[]))

-- name: nack
SELECT pgmb.nack(queue_name => %(queue)s, delivery_ids => %(ids)s::bigint[],
                 read_counts => %(read_counts)s::integer[], errors => %(errors)s::text[])

-- name: purge
SELECT pgmb.purge(queue_name => %(queue)s)

-- name: next_visible
SELECT pgmb.pull_next_visible(queue_name => %(queue)s)

-- name: queue_lease
-- The consumer's default visibility timeout: the queue's lease (checked a pull queue first).
SELECT q.lease_seconds FROM pgmb_queue q, pgmb.pull_queue(%(queue)s) AS p WHERE q.id = p.id
