-- Dispatchers' registrations as pgmb/dispatcher_registry.py calls them (the functions of
-- schema/dispatchers.sql).

-- name: start
SELECT pgmb.dispatcher_start(kind => %(kind)s, host => %(host)s, pid => %(pid)s, queues => %(queues)s)

-- name: beat
SELECT pgmb.dispatcher_beat(dispatcher_id => %(id)s, in_flight => %(in_flight)s,
                            delivered => %(delivered)s, failed => %(failed)s)

-- name: stop
SELECT pgmb.dispatcher_stop(dispatcher_id => %(id)s, delivered => %(delivered)s, failed => %(failed)s)

-- name: list
SELECT d.id, d.kind, d.host, d.pid, d.queues, d.started_at, d.heartbeat_at, d.stopped_at,
       pgmb.dispatcher_state(d.heartbeat_at, d.stopped_at, coalesce(%(at)s::timestamptz, now())) AS state,
       d.in_flight, d.delivered, d.failed
FROM pgmb.dispatchers d

-- name: idle
SELECT pgmb.dispatcher_idle(dispatcher_id => %(id)s)

-- name: busy
SELECT pgmb.dispatcher_busy(dispatcher_id => %(id)s)
