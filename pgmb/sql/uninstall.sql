-- Reverse of the SQL core (migrating pgmb to zero). django-pgtrigger drops its triggers
-- but leaves their functions behind, so they are dropped here, with the triggers on them.
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
