-- Schedules (pgmb/schedules.py): the SQL API of schedules.sql.

-- name: schedule
SELECT pgmb.schedule(name => %(name)s, routing_key => %(routing_key)s, body => %(body)s::jsonb,
                     headers => %(headers)s::jsonb, cron => %(cron)s, every => %(every)s,
                     timezone => %(timezone)s, missed => %(missed)s, first_run => %(first_run)s,
                     task => %(task)s::jsonb)

-- name: pause
SELECT coalesce(pgmb.pause_schedule(name => %(name)s), false)

-- name: resume
SELECT coalesce(pgmb.resume_schedule(name => %(name)s), false)

-- name: unschedule
SELECT coalesce(pgmb.unschedule(name => %(name)s), false)

-- name: cron_next
SELECT pgmb.cron_next(%(expr)s, %(tz)s, %(after)s)
