-- The circuit breakers of workers (migration 0022), as pgmb/breakers.py calls them.

-- name: reset
SELECT pgmb.breaker_reset(worker_ids => %(ids)s::uuid[])
