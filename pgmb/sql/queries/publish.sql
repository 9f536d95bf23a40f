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

-- `send_unique` is `send` with a unique key and its on_duplicate (pgmb.admit_unique
-- decides): a statement of its own, so that a send without a key runs the one above
-- unchanged. No row: skipped on every queue; `unique_live` gives the live one's message.
-- `send_batch_unique` is `send_batch` with them, when some message of the batch has a key.

-- name: send_unique
INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at, priority,
                          group_key, depends_on, dedup_id, max_retries, retry_delay, expires_at,
                          unique_key, on_duplicate)
VALUES (%s, %s, %s::jsonb, %s::jsonb, now(),
        greatest(now(), coalesce(%s::timestamptz, now() + coalesce(%s::float8, 0) * interval '1 second')),
        %s, %s, %s::uuid[], %s, %s, %s::float8,
        coalesce(%s::timestamptz, now() + %s::float8 * interval '1 second'), %s, %s)
RETURNING id

-- name: unique_live
SELECT pgmb.unique_live(%s, %s)

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

-- name: send_batch_unique
INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at, priority,
                          group_key, depends_on, dedup_id, max_retries, retry_delay, expires_at,
                          unique_key, on_duplicate)
SELECT id, routing_key, body, headers, now(),
       greatest(now(), coalesce(at, now() + coalesce(seconds, 0) * interval '1 second')),
       priority, group_key, depends_on::uuid[], dedup_id, max_retries, retry_delay,
       coalesce(expires_at, now() + ttl * interval '1 second'), unique_key, on_duplicate
FROM unnest(%s::uuid[], %s::text[], %s::jsonb[], %s::jsonb[], %s::timestamptz[], %s::float8[],
            %s::smallint[], %s::text[], %s::text[], %s::text[], %s::integer[], %s::float8[],
            %s::float8[], %s::timestamptz[], %s::text[], %s::text[])
     AS t(id, routing_key, body, headers, at, seconds, priority, group_key, depends_on, dedup_id,
          max_retries, retry_delay, ttl, expires_at, unique_key, on_duplicate)
RETURNING id
