-- Reverse of 0001_initial (migrating pgmb to zero), run after django-pgtrigger has dropped
-- the triggers and before Django drops the tables: pg_cron's jobs, the trigger functions
-- django-pgtrigger leaves behind, then everything in schema pgmb (the PL/Python transport
-- included). The roles pgmb_producer, pgmb_consumer and pgmb_admin are the cluster's and stay.
SELECT pgmb.cron_uninstall();

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.proname ~ ('^pgtrigger_(route_messages|admit_message|check_routing_key_update'
                           '|worker_validate|worker_timeout|worker_retire_secret|hold_delivery|release_after_delivery'
                           '|release_after_dead_letter|queue_prepare|queue_views)_[0-9a-f]+$')
    LOOP
        EXECUTE format('DROP FUNCTION %s CASCADE', f);
    END LOOP;
END $$;

DROP SCHEMA IF EXISTS pgmb CASCADE;
