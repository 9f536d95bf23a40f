-- A worker's signing secrets (pgmb/worker_secrets.py); the rule is pgmb.signing_secrets().

-- name: signing_secrets
-- Now, as a claim at this moment would hand them to a dispatcher, for the worker's secret
-- as the caller has it (its stored one, or an unsaved worker's).
SELECT pgmb.signing_secrets(%(secret)s, %(worker_id)s::uuid, clock_timestamp())

-- name: forget_expired
SELECT pgmb.forget_expired_secrets()
