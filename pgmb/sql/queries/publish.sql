-- Publishing from Python. The routing trigger on pgmb_message does the rest.

-- Statements start with their verb (tests find them by it). `send` returns no row for a
-- duplicate for every queue of its key (pgmb.admit_message dropped it): `deduplicated` gives
-- the message it duplicates.
-- `send_batch` takes depends_on as one text per message ('{…}' or NULL): unnest cannot
-- take an array of arrays of different lengths.

-- name: send
INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at, priority,
                          group_key, depends_on, dedup_id, max_retries, retry_delay, expires_at)
VALUES (%s, %s, %s::jsonb, %s::jsonb, now(),
        greatest(now(), coalesce(%s::timestamptz, now() + coalesce(%s::float8, 0) * interval '1 second')),
        %s, %s, %s::uuid[], %s, %s, %s::float8,
        coalesce(%s::timestamptz, now() + %s::float8 * interval '1 second'))
RETURNING id

-- name: deduplicated
SELECT pgmb.deduplicated(%s, %s)

-- name: unrouted
SELECT id FROM pgmb.unrouted(%s::uuid[]) AS id

-- name: send_batch
INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at, priority,
                          group_key, depends_on, dedup_id, max_retries, retry_delay, expires_at)
SELECT id, routing_key, body, headers, now(),
       greatest(now(), coalesce(at, now() + coalesce(seconds, 0) * interval '1 second')),
       priority, group_key, depends_on::uuid[], dedup_id, max_retries, retry_delay,
       coalesce(expires_at, now() + ttl * interval '1 second')
FROM unnest(%s::uuid[], %s::text[], %s::jsonb[], %s::jsonb[], %s::timestamptz[], %s::float8[],
            %s::smallint[], %s::text[], %s::text[], %s::text[], %s::integer[], %s::float8[],
            %s::float8[], %s::timestamptz[])
     AS t(id, routing_key, body, headers, at, seconds, priority, group_key, depends_on, dedup_id,
          max_retries, retry_delay, ttl, expires_at)
RETURNING id
