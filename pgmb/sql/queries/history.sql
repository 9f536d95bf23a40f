-- The history's days (pgmb/history.py; pgmb/sql/schema/history.sql): made ahead, retired
-- when old.

-- name: premake
-- The day partitions of today and the days after it; how many tables were made.
SELECT pgmb.premake_history(%(days)s, coalesce(%(scan_limit)s::bigint, pgmb.history_scan_limit()))

-- name: defaults
-- Each default partition, the rows it holds by its statistics, and the most that premaking
-- reads by itself.
SELECT t.parent || '_default', pgmb.estimated_rows((t.parent || '_default')::regclass),
       pgmb.history_scan_limit()
FROM pgmb.history_tables() t
ORDER BY 1

-- name: retire
-- The days older than the age retired: each day, its messages and attempts removed
-- (counted if asked, else NULL), and the unfinished messages it keeps.
SELECT day, messages, attempts, kept
FROM pgmb.retire_history(make_interval(secs => %(seconds)s), %(count)s)
