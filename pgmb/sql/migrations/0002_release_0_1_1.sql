-- Migration 0002_release_0_1_1 (pgmb 0.1.1): what changed in pgmb/sql/schema/ since 0.1.0,
-- written by hand, by concern. Every object here is also in pgmb/sql/schema/, which stays
-- the source to read; tests/migrations proves both build the same catalog. 0.1.0's
-- dispatchers keep running while this applies: a function they call keeps its arguments
-- and result (a changed one gets a new name beside it; CONTRIBUTING.md, Migrations).

-- ==== Delivery: routing keys, leases of the in-database loop ====


-- ==== Publishing: times, dedup scope, dependencies, reserved headers, limits ====

-- The role that published a message (pgmb.caller(), written out: a role that may INSERT
-- need not execute pgmb's functions). De-duplication and dependencies are scoped by it
-- (docs/decisions/0054-dedup-per-producing-role.md). Added without a default first, so that
-- adding it to a big table writes nothing: rows stored before 0.1.1 have none (NULL).
ALTER TABLE pgmb_message ADD COLUMN IF NOT EXISTS producer name;
ALTER TABLE pgmb_message
    ALTER COLUMN producer SET DEFAULT coalesce(nullif(current_setting('role'), 'none'), session_user)::name;

-- Whether pgmb stores this time (a message's or a delivery's created_at and available_at):
-- finite, from the year 1 to before the year 10000 in UTC, which is what Python's datetime
-- holds (pgmb.durations.check_time; tests/rules, one table of cases for both). Outside it
-- a message is never due and no Python client (the admin included) can read the row.
CREATE OR REPLACE FUNCTION pgmb.valid_time(at timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT at >= '0001-01-01 00:00:00+00'::timestamptz AND at < '10000-01-01 00:00:00+00'::timestamptz $$;

-- A time a message is not delivered before (pgmb.send's delay): the time, or 22023 unless
-- pgmb.valid_time holds. NULL stays NULL (no delay).
CREATE OR REPLACE FUNCTION pgmb.check_time(at timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE AS $$
BEGIN
    IF NOT pgmb.valid_time(at) THEN
        RAISE EXCEPTION 'invalid delay %: a time must be finite, from the year 1 to the year 9999 (UTC)', at
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN at;
END $$;

-- Whether a message may not set this header (any case): HTTP's framing and encoding, what
-- a receiver, a proxy in front of it or its framework trusts (the client's address, the
-- method or URL to act on, the proxies passed), and what pgmb sets itself. The same list as
-- pgmb/worker_request.py RESERVED and RESERVED_PREFIXES (tests/rules, one table of cases);
-- pgmb.message_problem refuses these at publish, pgmb.run_headers drops them at delivery.
CREATE OR REPLACE FUNCTION pgmb.reserved_header(name text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT lower(name) = ANY ('{host,content-type,content-length,content-encoding,connection,transfer-encoding,expect,upgrade,te,trailer,keep-alive,proxy-connection,user-agent,authorization,proxy-authorization,cookie,forwarded,x-forwarded,via,x-real-ip,true-client-ip,x-client-ip,cf-connecting-ip,x-http-method-override,x-http-method,x-method-override,x-original-url,x-rewrite-url}'::text[])
             OR lower(name) LIKE 'pgmb-%' OR lower(name) LIKE 'webhook-%' OR lower(name) LIKE 'x-forwarded-%' $$;

-- The refusal of a row of pgmb_message or pgmb_delivery (table_name) whose created_at or
-- available_at pgmb.valid_time rejects (the check_*_times triggers' WHEN found one),
-- raised as a CHECK violation of <table>_times_valid naming the column and its value.
CREATE OR REPLACE FUNCTION pgmb.refuse_times(table_name text, row_id text, created_at timestamptz,
                                             available_at timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    bad text := CASE WHEN pgmb.valid_time(refuse_times.created_at)
                     THEN format('available_at %s', available_at) ELSE format('created_at %s', created_at) END;
BEGIN
    RAISE EXCEPTION '% % refused by %: % is not a time pgmb stores (finite, from the year 1 to the year 9999, UTC)',
                    CASE table_name WHEN 'pgmb_message' THEN 'message' ELSE 'delivery' END, row_id,
                    table_name || '_times_valid', bad
        USING ERRCODE = 'check_violation', TABLE = table_name, CONSTRAINT = table_name || '_times_valid';
END $$;

-- The messages that a message with this dedup id, created then by this producer, duplicates
-- for a queue of this dedup window and pattern: those of the same producing role with the
-- same dedup id, created within the window, whose routing key the queue's binding matches.
-- De-duplication is per queue (docs/decisions/0032-dedup-per-queue.md) and per producing
-- role (docs/decisions/0054-dedup-per-producing-role.md): a message sent elsewhere, or by
-- another role, suppresses nothing. (Rows stored before 0.1.1 have no producer: they
-- suppress nothing published since.)
CREATE OR REPLACE FUNCTION pgmb.duplicated(dedup_window float8, pattern text, message_id uuid,
                                           dedup_id text, created_at timestamptz, producer name)
RETURNS SETOF uuid
LANGUAGE sql STABLE AS $$
    SELECT x.id FROM pgmb_message x
    WHERE duplicated.dedup_window > 0
      AND x.dedup_id = duplicated.dedup_id AND x.id <> duplicated.message_id
      AND x.producer = duplicated.producer
      AND x.created_at > duplicated.created_at - duplicated.dedup_window * interval '1 second'
      AND ('.' || x.routing_key) ~ duplicated.pattern
$$;

-- pgmb.duplicated for a stored message (the routing trigger's call): its producer read back.
CREATE OR REPLACE FUNCTION pgmb.duplicated(dedup_window float8, pattern text, message_id uuid,
                                           dedup_id text, created_at timestamptz)
RETURNS SETOF uuid
LANGUAGE sql STABLE AS $$
    SELECT pgmb.duplicated(dedup_window, pattern, message_id, dedup_id, created_at,
                           (SELECT m.producer FROM pgmb_message m WHERE m.id = duplicated.message_id))
$$;

-- The message a duplicate was dropped for: the caller's newest with this dedup id that one
-- of the queues of the duplicate's routing key matches (pgmb.duplicated). The caller is
-- pgmb.caller(), written out as in pgmb_message.producer's default.
CREATE OR REPLACE FUNCTION pgmb.deduplicated(dedup_id text, routing_key text) RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT x.id FROM pgmb_message x
    WHERE x.dedup_id = deduplicated.dedup_id
      AND x.producer = coalesce(nullif(current_setting('role'), 'none'), session_user)::name
      AND EXISTS (SELECT FROM pgmb_queue q
                  WHERE q.binding_tags <@ pgmb.key_tags(deduplicated.routing_key)
                    AND ('.' || deduplicated.routing_key) ~ q.pattern
                    AND ('.' || x.routing_key) ~ q.pattern)
    ORDER BY x.created_at DESC, x.id DESC LIMIT 1
$$;

-- Before each message with options, or with times pgmb.valid_time rejects, is stored (the
-- admit_message trigger's WHEN): refuses such times (pgmb.refuse_times), enforces the options rule (as the check pgmb_message_options_valid,
-- with that name), refuses unknown dependencies (to a caller that may read messages; to
-- any other, a dependency on a message it did not publish counts as settled and is left
-- out, so that it cannot probe for ids: docs/decisions/0055-dependencies-on-own-messages.md),
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
    -- Its times (the trigger's WHEN lets in a message without options for them).
    IF NOT (pgmb.valid_time(m.created_at) AND pgmb.valid_time(m.available_at)) THEN
        PERFORM pgmb.refuse_times('pgmb_message', m.id::text, m.created_at, m.available_at);
    END IF;
    -- The options rule, reported as a check violation of pgmb_message_options_valid.
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'message % refused by pgmb_message_options_valid: %', m.id, problem
            USING ERRCODE = 'check_violation', CONSTRAINT = 'pgmb_message_options_valid';
    END IF;
    IF m.depends_on IS NOT NULL AND NOT pgmb.caller_sees_messages() THEN
        -- Whether another role's message exists, or is pending, is not this caller's to
        -- learn: its message waits only for its own (a role's messages carry its name).
        m.depends_on := nullif(ARRAY(SELECT dep FROM unnest(m.depends_on) AS dep
                                     WHERE EXISTS (SELECT FROM pgmb_message x
                                                   WHERE x.id = dep AND x.producer = m.producer)), '{}');
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
                                                                         m.dedup_id, created, m.producer))) THEN
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
    -- A time outside what pgmb stores (pgmb.valid_time, inline): never due, unreadable.
    IF delay IS NOT NULL AND NOT (delay >= '0001-01-01 00:00:00+00'::timestamptz
                                  AND delay < '10000-01-01 00:00:00+00'::timestamptz) THEN
        PERFORM pgmb.check_time(delay);
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

-- pgmb.send with a delay in whole seconds (checked by pgmb.check_delay, which only pgmb's
-- owner and pgmb_admin may call: so it acts for its caller too, and checks it first).
CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb, delay integer)
RETURNS uuid
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pgmb.may_publish() THEN
        PERFORM pgmb.require('publish');
    END IF;
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
    -- stored before the rule can still be paused. FOR SHARE: a concurrent change of the
    -- worker's timeout, whose check (pgmb.check_worker_timeout) cannot see this lease yet,
    -- commits first and is read here, or waits for this transaction and reads its lease
    -- (docs/decisions/0056-timeout-and-lease-take-turns.md).
    SELECT w.name, w.timeout INTO worker, timeout FROM pgmb_worker w
    WHERE w.id = q.worker_id
      AND NOT EXISTS (SELECT FROM pgmb_queue o
                      WHERE o.id = q.id AND o.worker_id = q.worker_id AND o.lease_seconds = q.lease_seconds)
    FOR SHARE OF w;
    IF FOUND AND NOT pgmb.timeout_within_lease(timeout, q.lease_seconds) THEN
        RAISE EXCEPTION 'invalid lease % s for queue %: it must be longer than the timeout of worker % (% s)',
                        q.lease_seconds, quote_literal(q.name), quote_literal(worker), timeout
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A request that outlasts its lease is posted twice: lengthen the lease or shorten the worker''s timeout.';
    END IF;
    RETURN q;
END $$;

-- send and its delay-in-seconds form act for their caller again (CREATE OR REPLACE reset them).
SELECT pgmb.pin_definers(ARRAY[
    'pgmb.send(uuid, text, jsonb, jsonb, timestamptz, integer, text, uuid[], text, integer, float8)',
    'pgmb.send(uuid, text, jsonb, jsonb, integer)'
]);

-- New functions are closed, like every function of pgmb's (access.sql; pgmb_admin gets them
-- through the default privileges pgmb.apply_access set).
REVOKE EXECUTE ON FUNCTION pgmb.valid_time(timestamptz), pgmb.check_time(timestamptz),
    pgmb.refuse_times(text, text, timestamptz, timestamptz),
    pgmb.duplicated(float8, text, uuid, text, timestamptz, name)
FROM PUBLIC;


-- ==== Console: endpoints and secrets ====


-- ==== Installation and privileges ====

