-- Statements of the admin (pgmb/admin/).

-- name: table_estimate
-- The planner's row count of a table (pg_class.reltuples: -1 until it is first analyzed).
SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass
