-- Reverse of 0021_access_control: pgmb.send as 0001 left it (invoker, no check), the grant
-- functions and the grant table gone. The three roles stay (roles are the cluster's, and
-- other databases may use them); what this database granted them is revoked.
REVOKE USAGE ON SCHEMA pgmb FROM PUBLIC;
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['pgmb_producer', 'pgmb_consumer', 'pgmb_admin'] LOOP
        CONTINUE WHEN NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r);
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA pgmb FROM %I', r);
        EXECUTE format('REVOKE USAGE ON SCHEMA pgmb FROM %I', r);
    END LOOP;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgmb_admin') THEN
        FOR r IN
            SELECT format('REVOKE ALL ON %s FROM pgmb_admin', c.oid::regclass)
            FROM pg_class c
            WHERE c.relnamespace = (SELECT t.relnamespace FROM pg_class t WHERE t.oid = 'pgmb_message'::regclass)
              AND c.relkind IN ('r', 'p', 'S', 'v') AND c.relname LIKE 'pgmb\_%'
        LOOP
            EXECUTE r;
        END LOOP;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb, delay timestamptz)
RETURNS uuid
LANGUAGE plpgsql AS $$
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION 'a message id is required' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass gen_random_uuid() for a new id.';
    END IF;
    PERFORM pgmb.check_routing_key(routing_key);
    IF body IS NULL THEN
        RAISE EXCEPTION 'a message body is required (JSON null is ''null''::jsonb)'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'message headers must be a JSON object, not %', jsonb_typeof(headers)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM pgmb_message m WHERE m.id = send.id) THEN
        RAISE EXCEPTION 'message % already exists', send.id
            USING ERRCODE = 'unique_violation',
                  HINT = 'Message ids are unique; pass gen_random_uuid() for a new message.';
    END IF;
    INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at)
    VALUES (send.id, send.routing_key, send.body, coalesce(send.headers, '{}'), now(),
            greatest(coalesce(send.delay, now()), now()));
    RETURN send.id;
END $$;
ALTER FUNCTION pgmb.send(uuid, text, jsonb, jsonb, timestamptz) SECURITY INVOKER RESET search_path;

DROP FUNCTION pgmb.revoke_queue_access(text, name);
DROP FUNCTION pgmb.grant_queue_access(text, name);
DROP FUNCTION pgmb.revoke_publish_access(name);
DROP FUNCTION pgmb.grant_publish_access(name);
DROP FUNCTION pgmb.set_membership(name, name, boolean);
DROP FUNCTION pgmb.install_access();
DROP FUNCTION pgmb.require(text, text);
DROP FUNCTION pgmb.may(text, uuid);
DROP FUNCTION pgmb.caller_in(name);
DROP FUNCTION pgmb.caller();
DROP TABLE pgmb.queue_grant;
