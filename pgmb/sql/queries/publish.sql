-- Publishing from Python. The routing trigger on pgmb_message does the rest.

-- name: send
INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at)
VALUES (%s, %s, %s::jsonb, %s::jsonb, now(),
        greatest(now(), coalesce(%s::timestamptz, now() + coalesce(%s::float8, 0) * interval '1 second')))

-- name: unrouted
SELECT id FROM pgmb.unrouted(%s::uuid[]) AS id

-- name: send_batch
INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at)
SELECT id, routing_key, body, headers, now(),
       greatest(now(), coalesce(at, now() + coalesce(seconds, 0) * interval '1 second'))
FROM unnest(%s::uuid[], %s::text[], %s::jsonb[], %s::jsonb[], %s::timestamptz[], %s::float8[])
     AS t(id, routing_key, body, headers, at, seconds)
