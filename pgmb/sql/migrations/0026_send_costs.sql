-- pgmb 0026: a plain pgmb.send costs what it did before 0021-0025 added access control
-- and message options.
--
-- Counted with callgrind (bench/instructions.py), one pgmb.send per statement: 0.77 M
-- instructions after 0020, 1.08 M after 0025. The largest parts of the difference:
--   * the CHECK pgmb_message_options_valid: PostgreSQL reads a CHECK's expression tree from
--     its stored text for every statement that inserts (stringToNode), and this one is
--     large; a single-row INSERT pays it whole. The rule now runs in the admit_message
--     trigger, whose WHEN clause lists every option column, so a message without options
--     still never calls a function;
--   * pgmb.send's publish check called pgmb.require, which called pgmb.may: two SECURITY
--     DEFINER functions, each setting and restoring search_path. pgmb.send already acts for
--     its caller with a fixed search_path, so it tests pgmb.may_publish() (an inlinable SQL
--     function, one rule for pgmb.may and pgmb.send) and calls pgmb.require only to refuse.
-- The admit trigger's new WHEN clause is set by the Django migration (pgtrigger).

-- ---- the publish rule, once ----------------------------------------------------------

-- The caller (pgmb.caller) may publish: it may insert messages itself, or it is a member of
-- pgmb_producer. Used from functions with a fixed search_path only (pgmb.may, pgmb.send).
CREATE FUNCTION pgmb.may_publish() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT has_table_privilege(pgmb.caller(), 'pgmb_message', 'INSERT') OR pgmb.caller_in('pgmb_producer')
$$;

CREATE OR REPLACE FUNCTION pgmb.may(action text, queue_id uuid DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    who name := pgmb.caller();
BEGIN
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

-- ---- option rules in the admit trigger --------------------------------------------------

CREATE OR REPLACE FUNCTION pgmb.admit_message(m pgmb_message) RETURNS pgmb_message
LANGUAGE plpgsql AS $$
DECLARE
    missing uuid;
    window_seconds float8;
    problem text := pgmb.message_options_problem(m.id, m.priority, m.group_key, m.depends_on,
                                                 m.dedup_id, m.max_retries, m.retry_delay);
BEGIN
    -- What the CHECK pgmb_message_options_valid enforced until 0026, with its name and code.
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'message % refused by pgmb_message_options_valid: %', m.id, problem
            USING ERRCODE = 'check_violation', CONSTRAINT = 'pgmb_message_options_valid';
    END IF;
    IF m.depends_on IS NOT NULL THEN
        SELECT dep INTO missing FROM unnest(m.depends_on) AS dep
        WHERE NOT EXISTS (SELECT FROM pgmb_message x WHERE x.id = dep) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'message % depends on message %, which does not exist', m.id, missing
                USING ERRCODE = 'foreign_key_violation',
                      HINT = 'Publish the messages it depends on first (earlier in the same batch is fine).';
        END IF;
    END IF;
    IF m.dedup_id IS NOT NULL THEN
        -- Concurrent publishers of one dedup id take turns; the second sees the first.
        PERFORM pg_advisory_xact_lock(hashtextextended('pgmb dedup ' || m.dedup_id, 0));
        SELECT max(q.dedup_window) INTO window_seconds FROM pgmb_queue q
        WHERE q.literal_words <@ string_to_array(m.routing_key, '.')
          AND ('.' || m.routing_key) ~ q.pattern;
        IF window_seconds > 0 AND EXISTS (
            SELECT FROM pgmb_message x
            WHERE x.dedup_id = m.dedup_id AND x.id <> m.id
              AND x.created_at > coalesce(m.created_at, now()) - window_seconds * interval '1 second') THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN m;
END $$;

ALTER TABLE pgmb_message DROP CONSTRAINT pgmb_message_options_valid;

-- ---- pgmb.send --------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgmb.send(
    id uuid, routing_key text, body jsonb, headers jsonb, delay timestamptz,
    priority integer DEFAULT 0, group_key text DEFAULT NULL, depends_on uuid[] DEFAULT NULL,
    dedup_id text DEFAULT NULL, max_retries integer DEFAULT NULL, retry_delay float8 DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    stored uuid;
BEGIN
    -- Access control (0021): the inlined test first, pgmb.require only to refuse with its
    -- message (two SECURITY DEFINER calls cost more than the rest of the checks).
    IF NOT pgmb.may_publish() THEN
        PERFORM pgmb.require('publish');
    END IF;
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
    -- Only with options: the plain calls of the shorter forms skip the call.
    IF send.priority IS DISTINCT FROM 0 OR send.group_key IS NOT NULL OR send.depends_on IS NOT NULL
       OR send.dedup_id IS NOT NULL OR send.max_retries IS NOT NULL OR send.retry_delay IS NOT NULL THEN
        PERFORM pgmb.check_message_options(send.id, send.priority, send.group_key, send.depends_on,
                                           send.dedup_id, send.max_retries, send.retry_delay);
    END IF;
    IF EXISTS (SELECT 1 FROM pgmb_message m WHERE m.id = send.id) THEN
        RAISE EXCEPTION 'message % already exists', send.id
            USING ERRCODE = 'unique_violation',
                  HINT = 'Message ids are unique; pass gen_random_uuid() for a new message.';
    END IF;
    INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at, priority,
                              group_key, depends_on, dedup_id, max_retries, retry_delay)
    VALUES (send.id, send.routing_key, send.body, coalesce(send.headers, '{}'), now(),
            greatest(coalesce(send.delay, now()), now()), send.priority, send.group_key,
            send.depends_on, send.dedup_id, send.max_retries, send.retry_delay)
    RETURNING pgmb_message.id INTO stored;
    RETURN coalesce(stored, pgmb.deduplicated(send.dedup_id));
END $$;

-- CREATE OR REPLACE keeps neither SECURITY DEFINER nor search_path: set them again, as
-- 0021 and 0025 did.
DO $$
DECLARE
    tables name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE c.oid = 'pgmb_message'::regclass);
BEGIN
    EXECUTE format('ALTER FUNCTION pgmb.send(uuid, text, jsonb, jsonb, timestamptz, integer, text, uuid[], text, integer, float8) '
                   'SECURITY DEFINER SET search_path = %I, pg_temp', tables);
    EXECUTE format('ALTER FUNCTION pgmb.may(text, uuid) SECURITY DEFINER SET search_path = %I, pg_temp', tables);
END $$;

-- pgmb_admin's privileges (0021) cover the tables created since: pgmb_task_result (0024).
-- (Once appended to 0025 after it had landed; a database that ran 0025 before that gets it
-- here.)
SELECT pgmb.install_access();
