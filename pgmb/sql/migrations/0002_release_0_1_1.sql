-- Migration 0002_release_0_1_1 (pgmb 0.1.1): what changed in pgmb/sql/schema/ since 0.1.0,
-- written by hand, by concern. Every object here is also in pgmb/sql/schema/, which stays
-- the source to read; tests/migrations proves both build the same catalog. 0.1.0's
-- dispatchers keep running while this applies: a function they call keeps its arguments
-- and result (a changed one gets a new name beside it; CONTRIBUTING.md, Migrations).

-- ==== Delivery: routing keys, leases of the in-database loop ====


-- ==== Publishing: times, dedup scope, dependencies, reserved headers, limits ====


-- ==== Console: endpoints and secrets ====


-- ==== Installation and privileges ====

-- What the owner creates in schema pgmb later is not executable by PUBLIC, where the owner
-- is not a superuser (access.sql).
DO $$
BEGIN
    IF NOT current_setting('is_superuser')::boolean THEN
        ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON ROUTINES FROM PUBLIC;
    END IF;
END $$;

