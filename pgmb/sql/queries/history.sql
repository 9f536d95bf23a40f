-- The history's days (pgmb/history.py; pgmb/sql/schema/history.sql): made ahead, retired
-- when old.

-- name: premake
-- The day partitions of today and the days after it; how many tables were made.
SELECT pgmb.premake_history(%(days)s)

-- name: retire
-- The days older than the age retired: each day, its messages and attempts removed
-- (counted if asked, else NULL), and the unfinished messages it keeps.
SELECT day, messages, attempts, kept
FROM pgmb.retire_history(make_interval(secs => %(seconds)s), %(count)s)
