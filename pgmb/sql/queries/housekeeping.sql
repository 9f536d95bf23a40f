-- Housekeeping of the hot table (pgmb/housekeeping.py): its indexes are rebuilt when a
-- drained backlog left them at their high-water mark, and it is vacuumed once drained.
-- Run on an autocommit connection of its own: REINDEX ... CONCURRENTLY, DROP INDEX
-- CONCURRENTLY and VACUUM refuse a transaction block.

-- name: try_lock
-- One housekeeper per database at a time (dispatchers, the command, cron): a session lock,
-- let go by unlock or when the connection ends. Never taken through a transaction pooler
-- (pgmb.housekeeping.ThroughPooler): it would stay with a pooled server connection.
SELECT pg_try_advisory_lock(hashtextextended('pgmb housekeeping', 0))

-- name: unlock
SELECT pg_advisory_unlock(hashtextextended('pgmb housekeeping', 0))

-- name: session
-- A REINDEX CONCURRENTLY waits, between its phases, for the transactions that were running:
-- one left open by a client would hold it (and this connection) without end. Past this it
-- fails, leaving an invalid index that the next run drops.
SET lock_timeout = '10s'

-- name: indexes
-- Each index of pgmb_delivery: its size, whether it is valid, and whether it is the
-- leftover of an interrupted REINDEX CONCURRENTLY (an invalid "<name>_ccnew" copy, or the
-- "<name>_ccold" original). Live rows: the statistics' count (pg_stat_user_tables.n_live_tup,
-- kept current by every insert and delete), not reltuples, which waits for a vacuum or
-- analyze and so would still count a drained backlog.
SELECT n.nspname AS schema,
       c.relname AS name,
       pg_relation_size(i.indexrelid) AS bytes,
       i.indisvalid AS valid,
       NOT i.indisvalid AND c.relname ~ '_cc(new|old)[0-9]*$' AS leftover,
       greatest(pg_stat_get_live_tuples(i.indrelid), 0) AS live_rows
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE i.indrelid = 'pgmb_delivery'::regclass
ORDER BY c.relname

-- name: size
-- By name: the index REINDEX CONCURRENTLY leaves is a new relation under the old name.
SELECT pg_relation_size(to_regclass(format('%%I.%%I', %(schema)s::text, %(name)s::text)))

-- name: reindex
REINDEX INDEX CONCURRENTLY {index}

-- name: drop_leftover
DROP INDEX CONCURRENTLY IF EXISTS {index}

-- name: vacuum
-- Removes the rows and index entries of deliveries claimed and finished since the last
-- vacuum, which every claim's index scan otherwise walks past (docs/decisions/0009-a-small-hot-table-kept-small.md, "The
-- dispatcher vacuums the hot table").
VACUUM pgmb_delivery
