-- Questions the in-database path asks of a database (pgmb/indb.py).

-- name: capabilities
SELECT 'pg_cron' = ANY (string_to_array(replace(current_setting('shared_preload_libraries'), ' ', ''), ',')),
       current_setting('cron.database_name', true),
       (SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'),
       EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'http'),
       EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'plpython3u'),
       EXISTS (SELECT 1 FROM pg_language WHERE lanname = 'plpython3u'),
       pgmb.http_transport(),
       current_database()

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
