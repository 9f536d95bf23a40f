-- Reverse of 0001_initial (migrating pgmb to zero): pg_cron jobs, then everything in
-- schema pgmb. django-pgtrigger drops its triggers but leaves their functions behind,
-- so they are dropped here too.
SELECT pgmb.cron_uninstall();
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.proname ~ '^pgtrigger_(route_messages|worker_validate|queue_prepare|queue_views)_[0-9a-f]+$'
    LOOP
        EXECUTE format('DROP FUNCTION %s CASCADE', f);
    END LOOP;
END $$;
DROP SCHEMA IF EXISTS pgmb CASCADE;
