-- Operational events (pgmb/events.py; pgmb/sql/schema/events.sql).

-- name: enabled
SELECT pgmb.events_enabled()

-- name: set
SELECT pgmb.set_events(enabled => %(enabled)s)
