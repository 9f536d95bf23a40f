-- The circuit breakers of workers (schema/breakers.sql), as pgmb/breakers.py calls them.

-- name: reset
SELECT pgmb.breaker_reset(worker_ids => %(ids)s::uuid[])
