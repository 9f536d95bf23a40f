-- Questions the in-database path asks of a database (pgmb/indb.py).

-- name: capabilities
SELECT 'pg_cron' = ANY (string_to_array(replace(current_setting('shared_preload_libraries'), ' ', ''), ','))
           AS pg_cron_preloaded,
       current_setting('cron.database_name', true) AS pg_cron_database,
       (SELECT extversion FROM pg_extension WHERE extname = 'pg_cron') AS pg_cron_version,
       EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'http') AS http_extension,
       EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'plpython3u') AS plpython_available,
       EXISTS (SELECT 1 FROM pg_language WHERE lanname = 'plpython3u') AS plpython_installed,
       pgmb.http_transport() AS transport,
       current_database() AS database

-- name: create_plpython
CREATE EXTENSION IF NOT EXISTS plpython3u

-- name: create_pg_cron
CREATE EXTENSION IF NOT EXISTS pg_cron

-- name: cron_jobs
SELECT jobid, jobname, schedule, command, active FROM cron.job
WHERE jobname IN ('pgmb-dispatch', 'pgmb-maintenance') ORDER BY jobname

-- name: cron_runs
SELECT j.jobname, r.status, r.start_time, r.end_time, left(r.return_message, 200)
FROM cron.job_run_details r JOIN cron.job j ON j.jobid = r.jobid
WHERE j.jobname IN ('pgmb-dispatch', 'pgmb-maintenance')
ORDER BY r.start_time DESC LIMIT 10
