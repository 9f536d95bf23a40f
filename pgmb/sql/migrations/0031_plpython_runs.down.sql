-- Migrating back from 0031: the run function and the loader go; the operation then runs
-- 0030_keepalive_transport.sql again, which puts back 0030's pgmb.post_via_plpython.
DROP FUNCTION IF EXISTS pgmb.post_run_via_plpython(text[], text[], jsonb[], float8[], integer, float8, float8, float8, float8);
DROP FUNCTION IF EXISTS pgmb.load_plpython_transport();
