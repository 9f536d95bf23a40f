-- Reverse of 0002_release_0_1_1: puts back 0.1.0's objects that it changed, by concern in
-- the same order as the forward file.

-- ==== Delivery: routing keys, leases of the in-database loop ====


-- ==== Publishing: times, dedup scope, dependencies, reserved headers, limits ====


-- ==== Console: endpoints and secrets ====


-- ==== Installation and privileges ====

-- PostgreSQL's default again: the owner's new routines are executable by PUBLIC.
DO $$
BEGIN
    IF NOT current_setting('is_superuser')::boolean THEN
        ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON ROUTINES TO PUBLIC;
    END IF;
END $$;

