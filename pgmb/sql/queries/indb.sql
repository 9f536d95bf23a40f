-- Questions the in-database path asks of a database (pgmb/indb.py).

-- name: capabilities
-- Reads only what every role may read: the catalogs, and the settings pg_cron depends on
-- where the role may read them (a superuser, a member of pg_read_all_settings). For any
-- other role (a managed service's owner role) pg_cron_preloaded and pg_cron_database are
-- known only where pg_cron is installed here, which it can be only where it is preloaded
-- for this database; else NULL: unknown.
SELECT CASE WHEN settings_readable
            THEN 'pg_cron' = ANY (string_to_array(replace(current_setting('shared_preload_libraries'), ' ', ''), ','))
            WHEN pg_cron_version IS NOT NULL THEN true END AS pg_cron_preloaded,
       CASE WHEN settings_readable THEN current_setting('cron.database_name', true)
            WHEN pg_cron_version IS NOT NULL THEN current_database() END AS pg_cron_database,
       pg_cron_version,
       EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_cron') AS pg_cron_available,
       -- pg_cron's functions are in schema cron (the extension itself is in pg_catalog).
       (SELECT has_schema_privilege(n.oid, 'USAGE') FROM pg_namespace n
        WHERE n.nspname = 'cron' AND pg_cron_version IS NOT NULL) AS pg_cron_usable,
       EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'http') AS http_extension,
       EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'http') AS http_available,
       EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'plpython3u') AS plpython_available,
       EXISTS (SELECT 1 FROM pg_language WHERE lanname = 'plpython3u') AS plpython_installed,
       -- Whether this role may load the PL/Python transport: functions in an untrusted
       -- language are a superuser's to create (creating the language too), and a trusted
       -- one's are replaced only by their owner.
       current_setting('is_superuser')::boolean
       OR (coalesce((SELECT l.lanpltrusted AND has_language_privilege(l.oid, 'USAGE')
                     FROM pg_language l WHERE l.lanname = 'plpython3u'), false)
           AND NOT EXISTS (SELECT 1 FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                           WHERE l.lanname = 'plpython3u' AND p.pronamespace = to_regnamespace('pgmb')
                             AND NOT pg_has_role(p.proowner, 'USAGE'))) AS plpython_loadable,
       -- pgmb's owner: pg_cron runs a job as the role that scheduled it, this one.
       (SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'pgmb') AS pgmb_owner,
       pgmb.http_transport() AS transport,
       current_database() AS database,
       current_user AS role,
       quote_ident(current_user) AS role_ident,
       current_setting('is_superuser')::boolean AS superuser,
       settings_readable
FROM (SELECT pg_has_role('pg_read_all_settings', 'USAGE') AS settings_readable,
             (SELECT extversion FROM pg_extension WHERE extname = 'pg_cron') AS pg_cron_version) AS known

-- name: plpython_functions
-- The bodies of pgmb's functions in plpython3u, to compare with this version's.
SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
WHERE l.lanname = 'plpython3u' AND p.pronamespace = to_regnamespace('pgmb')

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
