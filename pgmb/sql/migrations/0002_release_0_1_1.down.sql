-- Reverse of 0002_release_0_1_1: puts back 0.1.0's objects that it changed, by concern in
-- the same order as the forward file.

-- ==== Delivery: routing keys, leases of the in-database loop ====


-- ==== Publishing: times, dedup scope, dependencies, reserved headers, limits ====

-- Whether a message may not set this header (any case): HTTP's framing and encoding, what
-- a receiver or a proxy in front of it trusts, and what pgmb sets itself. The same list as
-- pgmb/worker_request.py RESERVED and RESERVED_PREFIXES (tests/rules, one table of cases);
-- pgmb.message_problem refuses these at publish, pgmb.run_headers drops them at delivery.
CREATE OR REPLACE FUNCTION pgmb.reserved_header(name text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT lower(name) = ANY ('{host,content-type,content-length,content-encoding,connection,transfer-encoding,expect,upgrade,te,trailer,keep-alive,proxy-connection,user-agent,authorization,proxy-authorization,cookie,forwarded}'::text[])
             OR lower(name) LIKE 'pgmb-%' OR lower(name) LIKE 'webhook-%' OR lower(name) LIKE 'x-forwarded-%' $$;

-- The messages that a message with this dedup id, created then, duplicates for a queue of
-- this dedup window and pattern: those with the same dedup id, created within the window,
-- whose routing key the queue's binding matches. De-duplication is per queue
-- (docs/decisions/0032-dedup-per-queue.md): a message sent elsewhere suppresses nothing.
CREATE OR REPLACE FUNCTION pgmb.duplicated(dedup_window float8, pattern text, message_id uuid,
                                           dedup_id text, created_at timestamptz)
RETURNS SETOF uuid
LANGUAGE sql STABLE AS $$
    SELECT x.id FROM pgmb_message x
    WHERE duplicated.dedup_window > 0
      AND x.dedup_id = duplicated.dedup_id AND x.id <> duplicated.message_id
      AND x.created_at > duplicated.created_at - duplicated.dedup_window * interval '1 second'
      AND ('.' || x.routing_key) ~ duplicated.pattern
$$;

-- The message a duplicate was dropped for: the newest with this dedup id that one of the
-- queues of the duplicate's routing key matches (pgmb.duplicated).
CREATE OR REPLACE FUNCTION pgmb.deduplicated(dedup_id text, routing_key text) RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT x.id FROM pgmb_message x
    WHERE x.dedup_id = deduplicated.dedup_id
      AND EXISTS (SELECT FROM pgmb_queue q
                  WHERE q.binding_tags <@ pgmb.key_tags(deduplicated.routing_key)
                    AND ('.' || deduplicated.routing_key) ~ q.pattern
                    AND ('.' || x.routing_key) ~ q.pattern)
    ORDER BY x.created_at DESC, x.id DESC LIMIT 1
$$;

-- Before each message with dependencies or a de-duplication id is stored (the admit_message
-- trigger's WHEN): enforces the options rule (as the check pgmb_message_options_valid,
-- with that name), refuses unknown dependencies (to a caller that may read messages),
-- and returns NULL (the row is not stored)
-- for a message that duplicates one for every queue its routing key matches
-- (pgmb.duplicated; the candidate queues found by their tags). A message that
-- duplicates for some of its queues only is stored, and the routing trigger leaves those
-- queues out. Rows published earlier in the same statement are visible here.
CREATE OR REPLACE FUNCTION pgmb.admit_message(m pgmb_message) RETURNS pgmb_message
LANGUAGE plpgsql AS $$
DECLARE
    missing uuid;
    created timestamptz := coalesce(m.created_at, now());
    problem text := pgmb.message_options_problem(m.id, m.priority, m.group_key, m.depends_on,
                                                 m.dedup_id, m.max_retries, m.retry_delay);
BEGIN
    -- The options rule, reported as a check violation of pgmb_message_options_valid.
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'message % refused by pgmb_message_options_valid: %', m.id, problem
            USING ERRCODE = 'check_violation', CONSTRAINT = 'pgmb_message_options_valid';
    END IF;
    IF m.depends_on IS NOT NULL THEN
        SELECT dep INTO missing FROM unnest(m.depends_on) AS dep
        WHERE NOT EXISTS (SELECT FROM pgmb_message x WHERE x.id = dep) LIMIT 1;
        -- Only to a caller that may read messages: to any other, a dependency that does not
        -- exist is one that was settled and archived, so that it cannot probe for ids
        -- (docs/decisions/0039-refusals-tell-nothing.md).
        IF FOUND AND pgmb.caller_sees_messages() THEN
            RAISE EXCEPTION 'message % depends on message %, which does not exist', m.id, missing
                USING ERRCODE = 'foreign_key_violation',
                      HINT = 'Publish the messages it depends on first (earlier in the same batch is fine).';
        END IF;
    END IF;
    IF m.dedup_id IS NOT NULL THEN
        -- Concurrent publishers of one dedup id take turns; the second sees the first.
        PERFORM pg_advisory_xact_lock(hashtextextended('pgmb dedup ' || m.dedup_id, 0));
        IF EXISTS (SELECT FROM pgmb_queue q
                   WHERE q.binding_tags <@ pgmb.key_tags(m.routing_key) AND ('.' || m.routing_key) ~ q.pattern)
           AND NOT EXISTS (SELECT FROM pgmb_queue q
                           WHERE q.binding_tags <@ pgmb.key_tags(m.routing_key) AND ('.' || m.routing_key) ~ q.pattern
                             AND NOT EXISTS (SELECT FROM pgmb.duplicated(q.dedup_window, q.pattern, m.id,
                                                                         m.dedup_id, created))) THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN m;
END $$;

-- The SQL API of publishing: pgmb.send(id, routing_key, body, headers, delay, priority =>,
-- group_key =>, depends_on =>, dedup_id =>, max_retries =>, retry_delay =>), which every
-- shorter form calls. Acts for its caller (SECURITY DEFINER, set at the end of this file):
-- the caller needs pgmb_producer. Returns the message's id, or for a message dropped as a
-- duplicate for every queue of its key the id of the message it duplicates; to a caller
-- that may not read messages (pgmb.caller_sees_messages), always the id it sent.
CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb, delay timestamp with time zone, priority integer DEFAULT 0, group_key text DEFAULT NULL::text, depends_on uuid[] DEFAULT NULL::uuid[], dedup_id text DEFAULT NULL::text, max_retries integer DEFAULT NULL::integer, retry_delay double precision DEFAULT NULL::double precision) RETURNS uuid
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
DECLARE
    stored uuid;
BEGIN
    -- Access control (access.sql): the inlined test first, pgmb.require only to refuse with its
    -- message (two SECURITY DEFINER calls cost more than the rest of the checks).
    IF NOT pgmb.may_publish() THEN
        PERFORM pgmb.require('publish');
    END IF;
    IF id IS NULL THEN
        RAISE EXCEPTION 'a message id is required' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass gen_random_uuid() for a new id.';
    END IF;
    -- The rule inline (a simple expression); pgmb.check_routing_key only to say what is wrong.
    IF NOT coalesce(pgmb.valid_routing_key(routing_key), false) THEN
        PERFORM pgmb.check_routing_key(routing_key);
    END IF;
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
    INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at, priority,
                              group_key, depends_on, dedup_id, max_retries, retry_delay)
    VALUES (send.id, send.routing_key, send.body, coalesce(send.headers, '{}'), now(),
            greatest(coalesce(send.delay, now()), now()), send.priority, send.group_key,
            send.depends_on, send.dedup_id, send.max_retries, send.retry_delay)
    -- A taken id is found by the insert itself: no probe of the key before it. No row comes
    -- back for a taken id or for a duplicate that pgmb.admit_message dropped.
    ON CONFLICT ON CONSTRAINT pgmb_message_pkey DO NOTHING
    RETURNING pgmb_message.id INTO stored;
    IF stored IS NOT NULL THEN
        RETURN stored;
    END IF;
    -- Nothing stored: the id is taken, or the message duplicates one for every queue. A
    -- caller that may not read messages is told neither, nor another message's id: it gets
    -- the id it sent, as if stored, and a resent message is not stored twice
    -- (docs/decisions/0039-refusals-tell-nothing.md).
    IF NOT pgmb.caller_sees_messages() THEN
        RETURN send.id;
    END IF;
    IF EXISTS (SELECT 1 FROM pgmb_message m WHERE m.id = send.id) THEN
        RAISE EXCEPTION 'message % already exists', send.id
            USING ERRCODE = 'unique_violation',
                  HINT = 'Message ids are unique; pass gen_random_uuid() for a new message.';
    END IF;
    RETURN pgmb.deduplicated(send.dedup_id, send.routing_key);
END $$;

-- pgmb.send with a delay in whole seconds (checked by pgmb.check_delay).
CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb, delay integer)
RETURNS uuid
LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgmb.send(id, routing_key, body, headers,
                     now() + make_interval(secs => coalesce(pgmb.check_delay(delay), 0)));
END $$;

-- The BEFORE INSERT OR UPDATE trigger function of pgmb_queue: checks the name (and that
-- no other queue would own its views), compiles the binding key into the pattern and the
-- binding tags, and checks the retry, backoff and lease settings, the lease against its
-- worker's timeout included.
CREATE OR REPLACE FUNCTION pgmb.prepare_queue(q pgmb_queue) RETURNS pgmb_queue
LANGUAGE plpgsql AS $$
DECLARE
    other text;
    worker text;
    timeout double precision;
BEGIN
    PERFORM pgmb.check_name('queue', q.name);
    SELECT name INTO other FROM pgmb_queue
    WHERE pgmb.view_base(name) = pgmb.view_base(q.name) AND id <> q.id;
    IF FOUND AND other = q.name THEN
        RAISE EXCEPTION 'queue % already exists', quote_literal(other) USING ERRCODE = 'unique_violation';
    ELSIF FOUND THEN
        RAISE EXCEPTION 'queue name % clashes with queue %', quote_literal(q.name), quote_literal(other)
            USING ERRCODE = 'unique_violation',
                  DETAIL = format('Both would own the view pgmb.%I.', pgmb.view_base(q.name) || '_queue');
    END IF;
    q.pattern := pgmb.compile_binding(q.binding_key);
    q.binding_tags := pgmb.binding_tags(q.binding_key);
    IF q.max_retries IS NULL OR q.max_retries < 0 THEN
        RAISE EXCEPTION 'invalid max_retries % for queue %: it must be 0 or more', q.max_retries, q.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF q.backoff_base < 0 OR q.backoff_max < q.backoff_base THEN
        RAISE EXCEPTION 'invalid backoff for queue %: need 0 <= base (%) <= cap (%)', q.name, q.backoff_base, q.backoff_max
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF q.lease_seconds <= 0 THEN
        RAISE EXCEPTION 'invalid lease for queue %: it must be positive', q.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- NaN compares above every number here, so these also refuse it.
    IF q.lease_seconds > 2592000 OR q.backoff_base > 2592000 OR q.backoff_max > 2592000 THEN
        RAISE EXCEPTION 'invalid durations for queue %: the lease and the backoff may be at most 30 days (2592000 s)', q.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A queue's writes are rare (created, changed, paused): one look-up of its worker. An
    -- unchanged lease and worker stay accepted, as the worker's other rules do: a row
    -- stored before the rule can still be paused.
    SELECT w.name, w.timeout INTO worker, timeout FROM pgmb_worker w
    WHERE w.id = q.worker_id
      AND NOT EXISTS (SELECT FROM pgmb_queue o
                      WHERE o.id = q.id AND o.worker_id = q.worker_id AND o.lease_seconds = q.lease_seconds);
    IF FOUND AND NOT pgmb.timeout_within_lease(timeout, q.lease_seconds) THEN
        RAISE EXCEPTION 'invalid lease % s for queue %: it must be longer than the timeout of worker % (% s)',
                        q.lease_seconds, quote_literal(q.name), quote_literal(worker), timeout
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A request that outlasts its lease is posted twice: lengthen the lease or shorten the worker''s timeout.';
    END IF;
    RETURN q;
END $$;

SELECT pgmb.pin_definers(ARRAY[
    'pgmb.send(uuid, text, jsonb, jsonb, timestamptz, integer, text, uuid[], text, integer, float8)'
]);

DROP FUNCTION IF EXISTS pgmb.duplicated(float8, text, uuid, text, timestamptz, name);
DROP FUNCTION IF EXISTS pgmb.refuse_times(text, text, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS pgmb.check_time(timestamptz);
DROP FUNCTION IF EXISTS pgmb.valid_time(timestamptz);
ALTER TABLE pgmb_message DROP COLUMN IF EXISTS producer;

-- The functions django-pgtrigger leaves behind once it has dropped this migration's
-- triggers (check_message_update, check_message_times, check_delivery_times).
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.proname ~ '^pgtrigger_(check_message_update|check_message_times|check_delivery_times)_[0-9a-f]+$'
    LOOP
        EXECUTE format('DROP FUNCTION %s', f);
    END LOOP;
END $$;


-- ==== Console: endpoints and secrets ====


-- ==== Installation and privileges ====

