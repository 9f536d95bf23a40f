-- Access control (docs/access.md): the roles pgmb_producer, pgmb_consumer and pgmb_admin,
-- queue grants, and the checks of the functions that act for their caller.

-- Roles are the cluster's: without CREATEROLE (a managed service's owner role) a DBA
-- creates them, then runs SELECT pgmb.install_access(); (docs/access.md). Migrating goes on
-- without them: `migrate` and `manage.py check` say what the DBA runs (pgmb.group_roles).
-- Since PostgreSQL 16 the role that creates them gets ADMIN OPTION on them, so it may hand
-- them out (pgmb.set_membership).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgmb_producer') THEN
        CREATE ROLE pgmb_producer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgmb_consumer') THEN
        CREATE ROLE pgmb_consumer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgmb_admin') THEN
        CREATE ROLE pgmb_admin NOLOGIN;
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'pgmb: the roles pgmb_producer, pgmb_consumer and pgmb_admin were not created (%)',
                 SQLERRM
        USING HINT = 'manage.py check --database default names the statements a DBA runs (docs/access.md).';
END $$;

-- Whether the current role may grant group_role (an existing role's oid) to other roles:
-- a superuser, or a role with ADMIN OPTION on it; before PostgreSQL 16, also a CREATEROLE
-- role, for a role that is not a superuser. Since 16, CREATEROLE alone no longer suffices
-- for a role it did not create. Reads only the catalogs.
CREATE OR REPLACE FUNCTION pgmb.may_grant_role(group_role oid) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT pg_has_role(current_user, group_role, 'MEMBER WITH ADMIN OPTION')
        OR (current_setting('server_version_num')::integer < 160000
            AND EXISTS (SELECT FROM pg_roles me WHERE me.rolname = current_user AND me.rolcreaterole)
            AND NOT EXISTS (SELECT FROM pg_roles g WHERE g.oid = group_role AND g.rolsuper))
$$;

-- The three group roles as the current role (the owner) sees them: whether each exists,
-- whether pgmb's grants were given to it (pgmb.apply_access: a direct grant on schema
-- pgmb), and whether the current role may hand it out (pgmb.may_grant_role). What
-- `manage.py check` reports, with the statements a DBA runs.
CREATE OR REPLACE FUNCTION pgmb.group_roles()
RETURNS TABLE (role_name name, present boolean, applied boolean, grantable boolean)
LANGUAGE sql STABLE AS $$
    SELECT g.name, r.oid IS NOT NULL,
           r.oid IS NOT NULL AND EXISTS (SELECT FROM pg_namespace n, aclexplode(n.nspacl) a
                                         WHERE n.nspname = 'pgmb' AND a.grantee = r.oid),
           r.oid IS NOT NULL AND pgmb.may_grant_role(r.oid)
    FROM unnest('{pgmb_producer,pgmb_consumer,pgmb_admin}'::name[]) WITH ORDINALITY AS g(name, n)
    LEFT JOIN pg_roles r ON r.rolname = g.name
    ORDER BY g.n
$$;

-- Every role may call into pgmb, so that a refusal is pgmb's own error, which says what
-- grant is missing. The functions that act for a role check it; the others run with the
-- caller's privileges, and those need privileges on the tables.
GRANT USAGE ON SCHEMA pgmb TO PUBLIC;

-- Which queues a role may consume, besides pgmb_admin's members. A grant to a role that
-- no longer exists matches nobody (roles are joined by name), nor does a grant of a queue
-- deleted since: there is no foreign key, because Django's flush truncates pgmb_queue
-- alone. grant_queue_access clears such leftovers.
CREATE TABLE IF NOT EXISTS pgmb.queue_grant (
    queue_id uuid NOT NULL,
    role_name name NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, role_name)
);
CREATE INDEX IF NOT EXISTS queue_grant_role ON pgmb.queue_grant (role_name);

-- The role a definer function acts for.
CREATE OR REPLACE FUNCTION pgmb.caller() RETURNS name
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('role'), 'none'), session_user)::name
$$;

-- Whether the caller is a member (with its privileges) of a group role that may not exist.
CREATE OR REPLACE FUNCTION pgmb.caller_in(group_role name) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT FROM pg_roles r
                   WHERE r.rolname = group_role AND pg_has_role(pgmb.caller(), r.oid, 'USAGE'))
$$;

-- Raises insufficient_privilege unless the caller may; the message names who and what.
-- Like pgmb.may, callable by anyone about themselves.
CREATE OR REPLACE FUNCTION pgmb.require(action text, queue_name text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    qid uuid;
BEGIN
    PERFORM pgmb.refuse_writable_schemas();
    IF action = 'consume' THEN
        SELECT q.id INTO qid FROM pgmb_queue q WHERE q.name = queue_name;
        -- Only a role that may consume every queue (pgmb.may without a queue) learns that
        -- one does not exist: to any other, a missing queue and a queue not granted to it
        -- get the same refusal below (docs/decisions/0039-refusals-tell-nothing.md).
        IF qid IS NULL AND pgmb.may('consume', NULL) THEN
            RAISE EXCEPTION 'queue % does not exist', quote_nullable(queue_name)
                USING ERRCODE = 'undefined_object',
                      HINT = 'SELECT name FROM pgmb.queues WHERE worker_id IS NULL lists the pull queues.';
        END IF;
    END IF;
    IF pgmb.may(action, qid) THEN
        RETURN;
    END IF;
    CASE action
    WHEN 'publish' THEN
        RAISE EXCEPTION 'role % may not publish', quote_ident(pgmb.caller())
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('An administrator grants it: SELECT pgmb.grant_publish_access(%L);', pgmb.caller());
    WHEN 'consume' THEN
        RAISE EXCEPTION 'role % may not consume queue %', quote_ident(pgmb.caller()), quote_nullable(queue_name)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('An administrator grants it: SELECT pgmb.grant_queue_access(%L, %L);',
                                queue_name, pgmb.caller());
    ELSE
        RAISE EXCEPTION 'role % may not administer pgmb', quote_ident(pgmb.caller())
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'An administrator grants it: GRANT pgmb_admin TO the role;';
    END CASE;
END $$;

-- The grants that make the three roles what they are, each skipped while its role does not
-- exist; the roles' names in the order they were missing. The migration runs it even where
-- other roles may create in pgmb's schemas (PostgreSQL 14's public, by default): the
-- definers refuse to act there anyway, and `manage.py check` says what to revoke.
CREATE OR REPLACE FUNCTION pgmb.apply_access() RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    missing text[] := '{}';
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['pgmb_producer', 'pgmb_consumer', 'pgmb_admin'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
            missing := missing || r;
            CONTINUE;
        END IF;
        EXECUTE format('GRANT USAGE ON SCHEMA pgmb TO %I', r);
    END LOOP;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgmb_admin') THEN
        -- pgmb's tables and sequences only: the schema holds the project's others too.
        FOR r IN
            SELECT format('GRANT %s ON %s TO pgmb_admin',
                          CASE c.relkind WHEN 'S' THEN 'USAGE, SELECT' ELSE 'SELECT, INSERT, UPDATE, DELETE' END,
                          c.oid::regclass)
            FROM pg_class c
            WHERE c.relnamespace = (SELECT t.relnamespace FROM pg_class t WHERE t.oid = 'pgmb_message'::regclass)
              AND c.relkind IN ('r', 'p', 'S', 'v') AND c.relname LIKE 'pgmb\_%'
        LOOP
            EXECUTE r;
        END LOOP;
        EXECUTE 'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgmb TO pgmb_admin';
        -- Every function of pgmb's, those that post and loop included, and what the owner
        -- makes in schema pgmb from now on (each queue's views, functions of later releases).
        EXECUTE 'GRANT EXECUTE ON ALL ROUTINES IN SCHEMA pgmb TO pgmb_admin';
        EXECUTE 'ALTER DEFAULT PRIVILEGES IN SCHEMA pgmb GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO pgmb_admin';
        EXECUTE 'ALTER DEFAULT PRIVILEGES IN SCHEMA pgmb GRANT EXECUTE ON ROUTINES TO pgmb_admin';
    END IF;
    RETURN missing;
END $$;

-- What a DBA runs after creating the roles (docs/access.md): pgmb.apply_access, refused
-- while other roles may create in pgmb's schemas, where a grant would hand out functions
-- that could be hijacked.
CREATE OR REPLACE FUNCTION pgmb.install_access() RETURNS text[]
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmb.refuse_writable_schemas();
    RETURN pgmb.apply_access();
END $$;

-- Membership of a group role is changed by the function's owner: the application's role,
-- which created the roles (or got ADMIN OPTION on them from a DBA). Refused with the
-- statement a DBA runs where it may not (PostgreSQL 16+ with CREATEROLE alone, roles a DBA
-- made), before anything is written.
CREATE OR REPLACE FUNCTION pgmb.set_membership(group_role name, role_name name, member boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = group_role) THEN
        RAISE EXCEPTION 'role % does not exist', group_role
            USING ERRCODE = 'undefined_object',
                  HINT = 'A DBA creates it (docs/access.md), then runs SELECT pgmb.install_access();';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = role_name) THEN
        RAISE EXCEPTION 'role % does not exist', quote_ident(role_name) USING ERRCODE = 'undefined_object';
    END IF;
    IF NOT pgmb.may_grant_role((SELECT oid FROM pg_roles WHERE rolname = group_role)) THEN
        RAISE EXCEPTION 'pgmb: role % may not grant or revoke %', quote_ident(current_user), group_role
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('A DBA (a superuser, or a role with ADMIN OPTION on %1$s) runs: GRANT %1$s TO %2$I WITH ADMIN OPTION;',
                                group_role, current_user);
    END IF;
    IF member THEN
        EXECUTE format('GRANT %I TO %I', group_role, role_name);
    ELSE
        EXECUTE format('REVOKE %I FROM %I', group_role, role_name);
    END IF;
END $$;

-- Makes a role a publisher: a member of pgmb_producer.
CREATE OR REPLACE FUNCTION pgmb.grant_publish_access(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmb.require('administer');
    PERFORM pgmb.set_membership('pgmb_producer', role_name, true);
END $$;

-- Takes a role out of pgmb_producer.
CREATE OR REPLACE FUNCTION pgmb.revoke_publish_access(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmb.require('administer');
    PERFORM pgmb.set_membership('pgmb_producer', role_name, false);
END $$;

-- Returns whether the grant is new.
CREATE OR REPLACE FUNCTION pgmb.grant_queue_access(queue_name text, role_name name) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    qid uuid;
    added integer;
BEGIN
    PERFORM pgmb.require('administer');
    SELECT q.id INTO qid FROM pgmb_queue q WHERE q.name = queue_name;
    IF qid IS NULL THEN
        RAISE EXCEPTION 'queue % does not exist', quote_literal(queue_name) USING ERRCODE = 'undefined_object';
    END IF;
    PERFORM pgmb.set_membership('pgmb_consumer', role_name, true);
    DELETE FROM pgmb.queue_grant g WHERE NOT EXISTS (SELECT FROM pgmb_queue q WHERE q.id = g.queue_id);
    INSERT INTO pgmb.queue_grant (queue_id, role_name) VALUES (qid, grant_queue_access.role_name)
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS added = ROW_COUNT;
    RETURN added > 0;
END $$;

-- Returns whether there was a grant; the role stays in pgmb_consumer while it has others.
CREATE OR REPLACE FUNCTION pgmb.revoke_queue_access(queue_name text, role_name name) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    removed integer;
BEGIN
    PERFORM pgmb.require('administer');
    IF NOT EXISTS (SELECT FROM pgmb_queue q WHERE q.name = queue_name) THEN
        RAISE EXCEPTION 'queue % does not exist', quote_literal(queue_name) USING ERRCODE = 'undefined_object';
    END IF;
    DELETE FROM pgmb.queue_grant g USING pgmb_queue q
    WHERE q.id = g.queue_id AND q.name = queue_name AND g.role_name = revoke_queue_access.role_name;
    GET DIAGNOSTICS removed = ROW_COUNT;
    IF NOT EXISTS (SELECT FROM pgmb.queue_grant g WHERE g.role_name = revoke_queue_access.role_name)
       AND EXISTS (SELECT FROM pg_roles WHERE rolname = revoke_queue_access.role_name) THEN
        PERFORM pgmb.set_membership('pgmb_consumer', role_name, false);
    END IF;
    RETURN removed > 0;
END $$;

-- The caller (pgmb.caller) may publish: it may insert messages itself, or it is a member of
-- pgmb_producer. Used from functions with a fixed search_path only (pgmb.may, pgmb.send).
-- Refuses first while the schemas are writable (pgmb.refuse_writable_schemas): pgmb.send
-- calls it before anything else.
CREATE OR REPLACE FUNCTION pgmb.may_publish() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN pgmb.refuse_writable_schemas()
                THEN has_table_privilege(pgmb.caller(), 'pgmb_message', 'INSERT') OR pgmb.caller_in('pgmb_producer')
           END
$$;

-- Whether the caller may read pgmb's messages (the owner, pgmb_admin's members, a role
-- granted SELECT on pgmb_message): only such a caller is told about messages it did not
-- publish, that an id is taken or that a dependency does not exist (pgmb.send,
-- pgmb.admit_message; docs/decisions/0039-refusals-tell-nothing.md).
CREATE OR REPLACE FUNCTION pgmb.caller_sees_messages() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT has_table_privilege(pgmb.caller(), 'pgmb_message', 'SELECT')
$$;

-- Whether the calling role may publish, consume the queue, or administer pgmb
-- (action 'publish', 'consume' or 'administer'), from its memberships, grants and
-- privileges. 'consume' without a queue id: whether it may consume every queue.
CREATE OR REPLACE FUNCTION pgmb.may(action text, queue_id uuid DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    who name;
BEGIN
    PERFORM pgmb.refuse_writable_schemas();
    who := pgmb.caller();
    CASE action
    WHEN 'publish' THEN
        RETURN pgmb.may_publish();
    WHEN 'consume' THEN
        RETURN has_table_privilege(who, 'pgmb_delivery', 'DELETE')
            OR EXISTS (SELECT FROM pgmb.queue_grant g JOIN pg_roles r ON r.rolname = g.role_name
                       WHERE g.queue_id = may.queue_id AND pg_has_role(who, r.oid, 'USAGE'));
    WHEN 'administer' THEN
        RETURN has_table_privilege(who, 'pgmb_queue', 'UPDATE');
    ELSE
        RAISE EXCEPTION 'unknown action %', quote_literal(action) USING ERRCODE = 'invalid_parameter_value';
    END CASE;
END $$;

-- The entry points: acting for their caller, pinned by pgmb.pin_definers (tables.sql).
-- Each queue's views are made by their owner, so that a pgmb_admin member who creates a
-- queue need not create in pgmb.
SELECT pgmb.pin_definers(ARRAY[
    'pgmb.may(text, uuid)', 'pgmb.require(text, text)',
    'pgmb.grant_publish_access(name)', 'pgmb.revoke_publish_access(name)',
    'pgmb.grant_queue_access(text, name)', 'pgmb.revoke_queue_access(text, name)',
    'pgmb.install_access()',
    'pgmb.create_queue_views(uuid, text)', 'pgmb.drop_queue_views(text)'
]);

-- Closed by default (docs/decisions/0025-closed-by-default-functions.md): no function of
-- pgmb's is executable by PUBLIC but the reviewed list below, the calls that check their
-- caller themselves. A function added to any schema file is closed until it is listed here
-- and in tests/security/test_privileges.py. The owner and pgmb_admin (pgmb.install_access)
-- execute everything: posting, the in-database loop, the transports, the state machine.
-- (ALTER DEFAULT PRIVILEGES IN SCHEMA cannot revoke what PUBLIC gets by default; this
-- statement, run last by every migration that runs the schema, is what closes them.)
REVOKE EXECUTE ON ALL ROUTINES IN SCHEMA pgmb FROM PUBLIC;
-- What the owner creates in schema pgmb later (a function of its own, one of a later
-- release before its migration's grants) is closed too: PUBLIC's EXECUTE on a new routine
-- is a default of the whole database, which only this, for the owner's routines in every
-- schema of this database, takes away. Not for a superuser: it would close the functions
-- of every extension the superuser creates here later (pg_cron's cron.schedule among
-- them); there the check pgmb.W008 names what PUBLIC may execute beyond the list above
-- (docs/decisions/0060-an-owner-that-is-not-a-superuser.md).
DO $$
BEGIN
    IF NOT current_setting('is_superuser')::boolean THEN
        ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON ROUTINES FROM PUBLIC;
    END IF;
END $$;
GRANT EXECUTE ON FUNCTION
    -- publishing (pgmb_producer): checks its caller
    pgmb.send(uuid, text, jsonb),
    pgmb.send(uuid, text, jsonb, jsonb),
    pgmb.send(uuid, text, jsonb, jsonb, integer),
    pgmb.send(uuid, text, jsonb, jsonb, timestamptz, integer, text, uuid[], text, integer, float8),
    pgmb.send(uuid, text, jsonb, jsonb, timestamptz, float8, timestamptz, integer, text, uuid[], text, integer, float8),
    pgmb.send_unique(uuid, text, jsonb, text, text, jsonb, timestamptz, float8, timestamptz, integer, text, integer, float8),
    -- pull queues (pgmb_consumer): each checks the queue grant
    pgmb.read(text, double precision, integer, jsonb),
    pgmb.read_with_poll(text, double precision, integer, double precision, integer, jsonb),
    pgmb.pop(text, integer),
    pgmb.delete(text, bigint[]), pgmb.delete(text, bigint),
    pgmb.archive(text, bigint[]), pgmb.archive(text, bigint),
    pgmb.set_vt(text, bigint[], double precision), pgmb.set_vt(text, bigint, double precision),
    pgmb.nack(text, bigint[], integer[], text[]),
    pgmb.purge(text), pgmb.pull_next_visible(text),
    -- about the caller itself, and grants that refuse with pgmb's own message
    pgmb.may(text, uuid), pgmb.require(text, text),
    pgmb.grant_publish_access(name), pgmb.revoke_publish_access(name),
    pgmb.grant_queue_access(text, name), pgmb.revoke_queue_access(text, name)
TO PUBLIC;

-- The roles' privileges on the tables, views and functions (where the roles exist).
SELECT pgmb.apply_access();
