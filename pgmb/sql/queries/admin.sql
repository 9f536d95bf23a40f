-- Statements of the admin (pgmb/admin/).

-- name: table_estimate
-- The planner's row count of a table (pg_class.reltuples: -1 until it is first analyzed).
SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass

-- name: newest_with_key
-- The ids of the newest messages (up to a window) whose routing key matches a LIKE pattern
-- that is a prefix, in one of two ways, each planned one way only: left to choose by the
-- share of matches it estimates from a sample, the planner walked a third of a million-row
-- table for a prefix of three messages in a hundred. The matches are counted first
-- through the key's index, up to one more than "few":
-- - a few are read through that index and sorted (the CTE, read once);
-- - many are looked for from the newest message back, among the newest "walk" at most:
--   the LIMIT keeps the walk in its own subquery, and the outer LIMIT stops it early.
-- Each branch runs only if its one-time condition holds. Positional parameters (the
-- statement is a subquery of the admin's ORM queries): pattern, few, few, window, walk,
-- pattern, few, window.
WITH few AS MATERIALIZED (
    SELECT id, created_at FROM pgmb_message
    WHERE routing_key LIKE %s ORDER BY routing_key USING ~<~ LIMIT %s + 1
)
(
    SELECT id FROM few WHERE (SELECT count(*) FROM few) <= %s
    ORDER BY created_at DESC, id DESC LIMIT %s
)
UNION ALL
(
    SELECT newest.id
    FROM (
        SELECT id, routing_key FROM pgmb_message
        ORDER BY created_at DESC, id DESC LIMIT %s
    ) AS newest
    WHERE newest.routing_key LIKE %s AND (SELECT count(*) FROM few) > %s
    LIMIT %s
)
