-- Publishing: the SQL API (pgmb.send and its shorter forms, pgmb.worker, pgmb.create), the
-- message options (priority, groups, dependencies, de-duplication, per-message retries),
-- holding and releasing waiting deliveries, and waking dispatchers. The routing itself is
-- the route_messages trigger of pgmb_message (pgmb/sql/queries/triggers.sql).

-- Called by the routing trigger after a statement that created deliveries: a NOTIFY on
-- channel pgmb, at commit, when some running dispatcher or pull consumer waits for one
-- (or under an isolation level where the check could miss one). The setting pgmb.notify =
-- off turns it off for bulk loads.
CREATE OR REPLACE FUNCTION pgmb.wake_dispatchers() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('pgmb.notify', true), '') = 'off' THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed'
       OR EXISTS (SELECT FROM pgmb_dispatcher d
                  WHERE d.kind IN ('external', 'consumer') AND d.waiting IS NOT false
                    -- A killed dispatcher's mark would make publishers notify for ever.
                    AND pgmb.dispatcher_state(d.heartbeat_at, d.stopped_at) = 'running') THEN
        PERFORM pg_notify('pgmb', '');
    END IF;
END $$;

-- Why the options of a message are refused, or NULL. The same rules as
-- pgmb.options.check_options in Python (tests/rules holds one table of cases for both).
CREATE OR REPLACE FUNCTION pgmb.message_options_problem(
    message_id uuid, priority integer, group_key text, depends_on uuid[], dedup_id text,
    max_retries integer, retry_delay float8
) RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    IF priority IS NULL OR priority NOT BETWEEN -32768 AND 32767 THEN
        RETURN format('invalid priority %s: it must be a whole number from -32768 to 32767 (lower goes first)',
                      coalesce(priority::text, 'NULL'));
    END IF;
    IF group_key IS NOT NULL AND (length(group_key) > 128 OR NOT pgmb.valid_key(group_key)) THEN
        RETURN format('invalid group %s: 1 to 128 characters, no blanks or control characters',
                      quote_literal(group_key));
    END IF;
    IF dedup_id IS NOT NULL AND (length(dedup_id) > 128 OR NOT pgmb.valid_key(dedup_id)) THEN
        RETURN format('invalid dedup id %s: 1 to 128 characters, no blanks or control characters',
                      quote_literal(dedup_id));
    END IF;
    IF max_retries IS NOT NULL AND max_retries NOT BETWEEN 0 AND 1000000 THEN
        RETURN format('invalid max_retries %s: it must be from 0 to 1000000', max_retries);
    END IF;
    IF retry_delay IS NOT NULL THEN
        -- The delay rule (pgmb.check_delay), and at most the 30 days of a queue's backoff.
        IF retry_delay = 'NaN'::float8 OR retry_delay IN ('Infinity'::float8, '-Infinity'::float8)
           OR retry_delay < 0 OR retry_delay > 2592000 THEN
            RETURN format('invalid retry delay %s: it must be from 0 to 2592000 seconds (30 days)', retry_delay);
        END IF;
    END IF;
    IF depends_on IS NOT NULL THEN
        IF cardinality(depends_on) = 0 OR cardinality(depends_on) > 100 THEN
            RETURN 'invalid depends_on: name 1 to 100 messages (or none at all: NULL)';
        END IF;
        IF array_position(depends_on, NULL) IS NOT NULL THEN
            RETURN 'invalid depends_on: a message id is NULL';
        END IF;
        IF message_id = ANY (depends_on) THEN
            RETURN format('invalid depends_on: message %s cannot depend on itself', message_id);
        END IF;
    END IF;
    RETURN NULL;
END $$;

-- Why a message's expiry is refused, or NULL: the rule of pgmb.options.check_expiry in
-- Python (tests/rules, one table of cases for both). A ttl (seconds from publication) or an
-- expires_at, not both; a ttl positive, finite and ending before the year 10000; an
-- expires_at a time pgmb stores (pgmb.valid_time). A time already past is accepted: the
-- message expires at once (docs/decisions/0083-expiry.md).
CREATE OR REPLACE FUNCTION pgmb.expiry_problem(ttl float8, expires_at timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN ttl IS NOT NULL AND expires_at IS NOT NULL
            THEN 'give a message a ttl or an expires_at, not both'
        WHEN ttl = 'NaN'::float8 OR ttl IN ('Infinity'::float8, '-Infinity'::float8) OR ttl <= 0
            THEN format('invalid ttl %s: it must be a positive, finite number of seconds', ttl)
        WHEN ttl >= extract(epoch FROM timestamptz '10000-01-01 00:00:00+00' - now())::float8
            THEN format('invalid ttl %s: too long (past the year 9999)', ttl)
        WHEN NOT pgmb.valid_time(expires_at)
            THEN format('invalid expires_at %s: a time must be finite, from the year 1 to the year 9999 (UTC)', expires_at)
    END
$$;

-- Why a message's unique key or its on_duplicate is refused, or NULL: the rule of
-- pgmb.options.check_unique_key in Python (tests/rules, one table of cases for both). A key
-- of 1 to 128 characters, no blanks or control characters (pgmb.valid_key); on_duplicate
-- 'skip' (NULL is 'skip') or 'replace', the latter only with a key
-- (docs/decisions/0090-unique-while-live.md).
CREATE OR REPLACE FUNCTION pgmb.unique_key_problem(unique_key text, on_duplicate text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN on_duplicate IS NOT NULL AND on_duplicate NOT IN ('skip', 'replace')
            THEN format('invalid on_duplicate %s: it must be ''skip'' or ''replace''', quote_literal(on_duplicate))
        WHEN unique_key IS NULL AND on_duplicate = 'replace'
            THEN 'on_duplicate ''replace'' needs a unique key'
        WHEN unique_key IS NOT NULL AND (length(unique_key) > 128 OR NOT pgmb.valid_key(unique_key))
            THEN format('invalid unique key %s: 1 to 128 characters, no blanks or control characters',
                        quote_literal(unique_key))
    END
$$;

-- Raises the problem pgmb.message_options_problem finds in a message's options (as
-- invalid_parameter_value); true otherwise.
CREATE OR REPLACE FUNCTION pgmb.check_message_options(
    message_id uuid, priority integer, group_key text, depends_on uuid[], dedup_id text,
    max_retries integer, retry_delay float8
) RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    problem text := pgmb.message_options_problem(message_id, priority, group_key, depends_on,
                                                 dedup_id, max_retries, retry_delay);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN true;
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

-- Why a message's body or headers are refused, or NULL: the rule of pgmb/message_limits.py
-- (the limits are its constants; tests/rules runs one table of cases through both). The
-- body and the headers nest containers at most 64 deep (the value itself is 1); at most
-- 64 headers, each name and value together at most 8192 bytes (a value that is not a
-- string counts as its JSON text), 32768 in all; no reserved name (pgmb.reserved_header).
CREATE OR REPLACE FUNCTION pgmb.message_problem(body jsonb, headers jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    header text;
    size bigint;
    total bigint := 0;
    how_many integer;
BEGIN
    -- A container at level 64 below the body is at depth 65. Strict: lax mode would also
    -- unwrap arrays. The path stops at that level, so a deeper body costs no more.
    IF jsonb_path_exists(body, 'strict $.**{64} ? (@.type() == "object" || @.type() == "array")') THEN
        RETURN 'the body: nested deeper than 64 levels (limit max_depth)';
    END IF;
    IF jsonb_typeof(headers) IS DISTINCT FROM 'object' THEN
        RETURN NULL;  -- the CHECK pgmb_message_headers_object's to refuse
    END IF;
    SELECT count(*) INTO how_many FROM jsonb_object_keys(headers);
    IF how_many > 64 THEN
        RETURN format('%s headers, at most 64 (limit max_headers)', how_many);
    END IF;
    -- A header's value may be JSON too: the dispatcher and the admin turn it into text.
    IF jsonb_path_exists(headers, 'strict $.**{64} ? (@.type() == "object" || @.type() == "array")') THEN
        RETURN 'the headers: nested deeper than 64 levels (limit max_depth)';
    END IF;
    FOR header, size IN
        SELECT e.key, octet_length(e.key)::bigint + octet_length(CASE WHEN jsonb_typeof(e.value) = 'string'
                                                                      THEN e.value #>> '{}' ELSE e.value::text END)
        FROM jsonb_each(headers) AS e
    LOOP
        IF pgmb.reserved_header(header) THEN
            RETURN format('header %s is reserved: the broker or the worker sets it', quote_literal(header));
        END IF;
        IF size > 8192 THEN
            RETURN format('header %s has %s bytes, at most 8192 (limit max_header_bytes)',
                          quote_literal(left(header, 64)), size);
        END IF;
        total := total + size;
    END LOOP;
    IF total > 32768 THEN
        RETURN format('the headers have %s bytes, at most 32768 (limit max_headers_bytes)', total);
    END IF;
    RETURN NULL;
END $$;

-- Whether pgmb.message_problem finds nothing, its cheap part inline: the routing trigger
-- tests every message with it, and most have no headers.
CREATE OR REPLACE FUNCTION pgmb.acceptable_message(body jsonb, headers jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT NOT jsonb_path_exists(body, 'strict $.**{64} ? (@.type() == "object" || @.type() == "array")')
             AND (headers = '{}'::jsonb OR pgmb.message_problem(body, headers) IS NULL) $$;

-- The refusal of a row of pgmb_message that the routing trigger's checks reject: its
-- routing key (pgmb.refuse_routing_key), or its body or headers, raised as a CHECK
-- violation of pgmb_message_body_valid or pgmb_message_headers_valid naming the limit.
CREATE OR REPLACE FUNCTION pgmb.refuse_message(message_id uuid, routing_key text, body jsonb, headers jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    problem text;
BEGIN
    IF NOT coalesce(pgmb.valid_routing_key(routing_key), false) THEN
        PERFORM pgmb.refuse_routing_key(routing_key);
    END IF;
    problem := pgmb.message_problem(body, headers);
    RAISE EXCEPTION 'message % refused by %: %', message_id,
            CASE WHEN starts_with(problem, 'the body') THEN 'pgmb_message_body_valid' ELSE 'pgmb_message_headers_valid' END,
            problem
        USING ERRCODE = 'check_violation', TABLE = 'pgmb_message',
              CONSTRAINT = CASE WHEN starts_with(problem, 'the body') THEN 'pgmb_message_body_valid'
                                ELSE 'pgmb_message_headers_valid' END;
END $$;

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

-- The refusal of a message whose expires_at pgmb.valid_time rejects (an infinite one would
-- never expire, as NULL, but no Python client could read the row), raised as a CHECK
-- violation of pgmb_message_times_valid as pgmb.refuse_times does; nothing otherwise.
-- Called by pgmb.admit_message and, for an UPDATE, by the check_message_times trigger.
CREATE OR REPLACE FUNCTION pgmb.refuse_expiry(m pgmb_message) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF m.expires_at IS NOT NULL AND NOT pgmb.valid_time(m.expires_at) THEN
        RAISE EXCEPTION 'message % refused by pgmb_message_times_valid: expires_at % is not a time pgmb stores (finite, from the year 1 to the year 9999, UTC)',
                        m.id, m.expires_at
            USING ERRCODE = 'check_violation', TABLE = 'pgmb_message',
                  CONSTRAINT = 'pgmb_message_times_valid';
    END IF;
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
-- PL/pgSQL, so that it is not inlined into the routing trigger's statement, whose plan
-- would then read and lock each of pgmb_message's partitions (one a day of history,
-- history.sql) at every publish; only a message with a dedup id runs it.
CREATE OR REPLACE FUNCTION pgmb.duplicated(dedup_window float8, pattern text, message_id uuid,
                                           dedup_id text, created_at timestamptz)
RETURNS SETOF uuid
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT pgmb.duplicated(dedup_window, pattern, message_id, dedup_id, created_at,
                           (SELECT m.producer FROM pgmb_message m WHERE m.id = duplicated.message_id));
END $$;

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
-- queues out. Rows published earlier in the same statement are visible here. Last, a
-- message with a unique key or an on_duplicate gets pgmb.admit_unique's decision.
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
    PERFORM pgmb.refuse_expiry(m);
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
    IF m.unique_key IS NOT NULL OR m.on_duplicate IS NOT NULL THEN
        RETURN pgmb.admit_unique(m);
    END IF;
    RETURN m;
END $$;

-- The unique key's part of pgmb.admit_message (docs/decisions/0090-unique-while-live.md): its
-- rule (as the check pgmb_message_unique_key_valid), then, the key's lock held to the end of
-- the transaction (publishers of one key take turns; pgmb.admit_unique_delivery takes it
-- too), on each queue the message's routing key matches that has a live delivery with the
-- key: with 'replace', a pending one (ready, delayed, retrying, waiting) is deleted, to be
-- replaced by this message's, and one in flight (leased; on a pull queue, read and not
-- visible again yet) gives its key up, to be followed by this message's; with 'skip', when every such queue has one, NULL: the message is not
-- stored (pgmb.unique_live finds the live one). Where some queues have one and others not,
-- the message is stored and pgmb.admit_unique_delivery leaves those queues out.
CREATE OR REPLACE FUNCTION pgmb.admit_unique(m pgmb_message) RETURNS pgmb_message
LANGUAGE plpgsql AS $$
DECLARE
    problem text := pgmb.unique_key_problem(m.unique_key, m.on_duplicate);
    live record;
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'message % refused by pgmb_message_unique_key_valid: %', m.id, problem
            USING ERRCODE = 'check_violation', CONSTRAINT = 'pgmb_message_unique_key_valid';
    END IF;
    IF m.unique_key IS NULL THEN
        RETURN m;  -- 'skip' without a key: nothing to decide
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('pgmb unique ' || m.unique_key, 0));
    IF m.on_duplicate = 'replace' THEN
        FOR live IN
            SELECT d.id, d.state, d.attempts, d.available_at, q.worker_id FROM pgmb_queue q
            JOIN pgmb_delivery d ON d.queue_id = q.id AND d.unique_key = m.unique_key
            WHERE q.binding_tags <@ pgmb.key_tags(m.routing_key) AND ('.' || m.routing_key) ~ q.pattern
            ORDER BY d.id
            FOR UPDATE OF d
        LOOP
            -- In flight: leased, or a pull queue's message read and not visible again yet
            -- (what pgmb.expire leaves alone too).
            IF live.state = 'leased'
               OR (live.worker_id IS NULL AND live.attempts > 0 AND live.available_at > clock_timestamp()) THEN
                -- Its request is under way: it ends as it would have, this message after it.
                UPDATE pgmb_delivery d SET unique_key = NULL WHERE d.id = live.id;
            ELSE
                DELETE FROM pgmb_delivery d WHERE d.id = live.id;
            END IF;
        END LOOP;
        RETURN m;
    END IF;
    IF EXISTS (SELECT FROM pgmb_queue q
               WHERE q.binding_tags <@ pgmb.key_tags(m.routing_key) AND ('.' || m.routing_key) ~ q.pattern)
       AND NOT EXISTS (SELECT FROM pgmb_queue q
                       WHERE q.binding_tags <@ pgmb.key_tags(m.routing_key) AND ('.' || m.routing_key) ~ q.pattern
                         AND NOT EXISTS (SELECT FROM pgmb_delivery d
                                         WHERE d.queue_id = q.id AND d.unique_key = m.unique_key)) THEN
        RETURN NULL;
    END IF;
    RETURN m;
END $$;

-- Before each delivery with a unique key is stored (the admit_unique_key trigger's WHEN):
-- NULL, so not stored, when its queue has a live delivery with the key: one that
-- pgmb.admit_unique left there (skip), or one made earlier in the same statement. Under the
-- key's lock, so that two publishers never both find the queue free; the partial unique
-- index pgmb_delivery_unique_key is the rule's backstop.
CREATE OR REPLACE FUNCTION pgmb.admit_unique_delivery(d pgmb_delivery) RETURNS pgmb_delivery
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('pgmb unique ' || d.unique_key, 0));
    IF EXISTS (SELECT FROM pgmb_delivery x WHERE x.queue_id = d.queue_id AND x.unique_key = d.unique_key) THEN
        RETURN NULL;
    END IF;
    RETURN d;
END $$;

-- The message whose delivery holds this unique key on a queue of this routing key: what a
-- message that skipped (pgmb.admit_unique stored nothing) is told. The first such queue by
-- name decides; NULL when none holds it (any more).
CREATE OR REPLACE FUNCTION pgmb.unique_live(unique_key text, routing_key text) RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT d.message_id FROM pgmb_queue q
    JOIN pgmb_delivery d ON d.queue_id = q.id AND d.unique_key = unique_live.unique_key
    WHERE q.binding_tags <@ pgmb.key_tags(unique_live.routing_key)
      AND ('.' || unique_live.routing_key) ~ q.pattern
    ORDER BY q.name LIMIT 1
$$;

-- Whether a delivery must wait: an earlier live delivery of its group on its queue, or a
-- dependency with a live delivery or a dead letter anywhere.
CREATE OR REPLACE FUNCTION pgmb.delivery_blocked(delivery_id bigint, queue_id uuid, group_key text, depends_on uuid[])
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT (group_key IS NOT NULL AND EXISTS (
                SELECT FROM pgmb_delivery h
                WHERE h.queue_id = delivery_blocked.queue_id AND h.group_key = delivery_blocked.group_key
                  AND h.id < delivery_id))
        OR (depends_on IS NOT NULL AND (
                EXISTS (SELECT FROM pgmb_delivery x WHERE x.message_id = ANY (delivery_blocked.depends_on))
                OR EXISTS (SELECT FROM pgmb_dead_letter x
                           WHERE x.message_id = ANY (delivery_blocked.depends_on))))
$$;

-- Before each delivery with a group or dependencies is stored: 'waiting' if it must wait.
-- The locks make a concurrent settlement of what it waits for either finish first (then
-- it is seen gone here) or wait for this transaction (then its trigger sees this row).
CREATE OR REPLACE FUNCTION pgmb.hold_delivery(d pgmb_delivery) RETURNS pgmb_delivery
LANGUAGE plpgsql AS $$
DECLARE
    previous bigint;
BEGIN
    IF d.group_key IS NOT NULL THEN
        -- Publishers of one group take turns, so two cannot both start an empty group.
        PERFORM pg_advisory_xact_lock(hashtextextended('pgmb group ' || d.queue_id || ' ' || d.group_key, 0));
        LOOP
            SELECT p.id INTO previous FROM pgmb_delivery p
            WHERE p.queue_id = d.queue_id AND p.group_key = d.group_key AND p.id < d.id
            ORDER BY p.id DESC LIMIT 1
            FOR KEY SHARE;
            -- Nothing locked: the group is empty, or its last member left meanwhile.
            EXIT WHEN FOUND OR NOT EXISTS (
                SELECT FROM pgmb_delivery p
                WHERE p.queue_id = d.queue_id AND p.group_key = d.group_key AND p.id < d.id);
        END LOOP;
    END IF;
    IF d.depends_on IS NOT NULL THEN
        -- Marks (and so locks) the dependencies' live deliveries: their removal releases
        -- this one (the AFTER DELETE trigger fires for marked rows only).
        UPDATE pgmb_delivery x SET dependents = true
        WHERE x.message_id = ANY (d.depends_on) AND x.id <> d.id;
    END IF;
    IF pgmb.delivery_blocked(d.id, d.queue_id, d.group_key, d.depends_on) THEN
        d.state := 'waiting';
    END IF;
    RETURN d;
END $$;

-- Whether some waiting delivery depends on this message (requeue and replay mark the
-- deliveries they create, as hold_delivery marks the ones that exist).
CREATE OR REPLACE FUNCTION pgmb.has_dependents(message_id uuid) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT FROM pgmb_delivery w
                   WHERE w.depends_on @> ARRAY[has_dependents.message_id] AND w.state = 'waiting')
$$;

-- Make these waiting deliveries ready where nothing holds them any more.
CREATE OR REPLACE FUNCTION pgmb.promote_waiting(delivery_ids bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    candidate bigint;
    promoted integer := 0;
BEGIN
    FOR candidate IN SELECT DISTINCT c FROM unnest(delivery_ids) AS c WHERE c IS NOT NULL ORDER BY c LOOP
        -- Locked first, judged in the next statement: two settlements that each release
        -- half of its conditions take turns, and the second sees the first's.
        PERFORM FROM pgmb_delivery w WHERE w.id = candidate AND w.state = 'waiting' FOR NO KEY UPDATE;
        CONTINUE WHEN NOT FOUND;
        UPDATE pgmb_delivery w SET state = 'ready'
        WHERE w.id = candidate AND w.state = 'waiting'
          AND NOT pgmb.delivery_blocked(w.id, w.queue_id, w.group_key, w.depends_on);
        IF FOUND THEN
            promoted := promoted + 1;
        END IF;
    END LOOP;
    IF promoted > 0 THEN
        PERFORM pgmb.wake_dispatchers();
    END IF;
    RETURN promoted;
END $$;

-- After a dead letter leaves (purged, requeued, its queue deleted): the deliveries that
-- depend on its message (a requeued dependency is live again and keeps them waiting).
CREATE OR REPLACE FUNCTION pgmb.release_dependents(message_id uuid) RETURNS void
LANGUAGE sql AS $$
    SELECT pgmb.promote_waiting(ARRAY(
        SELECT w.id FROM pgmb_delivery w
        WHERE w.depends_on @> ARRAY[release_dependents.message_id] AND w.state = 'waiting'))
$$;

-- After a delivery with a group or dependents leaves the hot table (acked, dead-lettered,
-- its queue deleted): its group's new head, and the deliveries that depend on its message.
CREATE OR REPLACE FUNCTION pgmb.release_after(d pgmb_delivery) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmb.promote_waiting(
        ARRAY(SELECT h.id FROM pgmb_delivery h
              WHERE d.group_key IS NOT NULL AND h.queue_id = d.queue_id AND h.group_key = d.group_key
              ORDER BY h.id LIMIT 1)
        || ARRAY(SELECT w.id FROM pgmb_delivery w
                 WHERE d.dependents AND w.depends_on @> ARRAY[d.message_id] AND w.state = 'waiting'));
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

-- pgmb.send with an expiry (docs/delivery.md, Expiry): ttl, seconds from now, or expires_at,
-- a time (one of the two, or neither: NULL), then the options of the pgmb.send above. A
-- delivery not posted (or read) by then expires, as by its queue's message_ttl (the earlier
-- of the two holds). ttl has no default, so that a call of the form above never reaches this
-- one (a sixth argument of type integer, a priority, matches that form exactly): name it,
-- `pgmb.send(id, key, body, headers, NULL, ttl => 30)` or `..., ttl => NULL, expires_at =>
-- '2030-01-01Z')`. The same body as above, with the
-- expiry's rule and column: one more call in the plain form's path would cost every publish.
CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb, delay timestamp with time zone, ttl double precision, expires_at timestamp with time zone DEFAULT NULL::timestamp with time zone, priority integer DEFAULT 0, group_key text DEFAULT NULL::text, depends_on uuid[] DEFAULT NULL::uuid[], dedup_id text DEFAULT NULL::text, max_retries integer DEFAULT NULL::integer, retry_delay double precision DEFAULT NULL::double precision) RETURNS uuid
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
DECLARE
    stored uuid;
    expiry text := pgmb.expiry_problem(send.ttl, send.expires_at);
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
    IF expiry IS NOT NULL THEN
        RAISE EXCEPTION '%', expiry USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Only with options: the plain calls of the shorter forms skip the call.
    IF send.priority IS DISTINCT FROM 0 OR send.group_key IS NOT NULL OR send.depends_on IS NOT NULL
       OR send.dedup_id IS NOT NULL OR send.max_retries IS NOT NULL OR send.retry_delay IS NOT NULL THEN
        PERFORM pgmb.check_message_options(send.id, send.priority, send.group_key, send.depends_on,
                                           send.dedup_id, send.max_retries, send.retry_delay);
    END IF;
    INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at, priority,
                              group_key, depends_on, dedup_id, max_retries, retry_delay, expires_at)
    VALUES (send.id, send.routing_key, send.body, coalesce(send.headers, '{}'), now(),
            greatest(coalesce(send.delay, now()), now()), send.priority, send.group_key,
            send.depends_on, send.dedup_id, send.max_retries, send.retry_delay,
            coalesce(send.expires_at, now() + send.ttl * interval '1 second'))
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

-- pgmb.send with a unique key (docs/publishing.md, Unique while live): while a delivery with
-- the key is live on a queue of the routing key, the message is skipped there
-- (on_duplicate 'skip', the default) or replaces the pending one (on_duplicate 'replace';
-- one in flight is followed instead). Returns the new message's id; when every queue
-- skipped, nothing is stored and the id of the live one's message is returned (to a caller
-- that may not read messages, the id it sent: docs/decisions/0039-refusals-tell-nothing.md).
-- A function of its own, not an overload of pgmb.send: another optional argument there
-- would make the released forms' calls ambiguous (docs/decisions/0090-unique-while-live.md).
CREATE OR REPLACE FUNCTION pgmb.send_unique(
    id uuid, routing_key text, body jsonb, unique_key text, on_duplicate text DEFAULT 'skip',
    headers jsonb DEFAULT NULL, delay timestamptz DEFAULT NULL, ttl float8 DEFAULT NULL,
    expires_at timestamptz DEFAULT NULL, priority integer DEFAULT 0, group_key text DEFAULT NULL,
    max_retries integer DEFAULT NULL, retry_delay float8 DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
    stored uuid;
    live uuid;
    problem text := coalesce(pgmb.unique_key_problem(send_unique.unique_key, send_unique.on_duplicate),
                             pgmb.expiry_problem(send_unique.ttl, send_unique.expires_at));
BEGIN
    IF NOT pgmb.may_publish() THEN
        PERFORM pgmb.require('publish');
    END IF;
    IF id IS NULL THEN
        RAISE EXCEPTION 'a message id is required' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass gen_random_uuid() for a new id.';
    END IF;
    IF send_unique.unique_key IS NULL THEN
        RAISE EXCEPTION 'a unique key is required' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Without one, call pgmb.send.';
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
    PERFORM pgmb.check_time(delay);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pgmb.check_message_options(send_unique.id, send_unique.priority, send_unique.group_key,
                                       NULL, NULL, send_unique.max_retries, send_unique.retry_delay);
    -- A live delivery settled between the INSERT that skipped and the look-up frees its key:
    -- then the INSERT is tried again (acks do not take the key's lock).
    FOR attempt IN 1..3 LOOP
        INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at, priority,
                                  group_key, max_retries, retry_delay, expires_at, unique_key,
                                  on_duplicate)
        VALUES (send_unique.id, send_unique.routing_key, send_unique.body,
                coalesce(send_unique.headers, '{}'), now(),
                greatest(coalesce(send_unique.delay, now()), now()), send_unique.priority,
                send_unique.group_key, send_unique.max_retries, send_unique.retry_delay,
                coalesce(send_unique.expires_at, now() + send_unique.ttl * interval '1 second'),
                send_unique.unique_key, send_unique.on_duplicate)
        ON CONFLICT ON CONSTRAINT pgmb_message_pkey DO NOTHING
        RETURNING pgmb_message.id INTO stored;
        IF stored IS NOT NULL THEN
            RETURN stored;
        END IF;
        IF NOT pgmb.caller_sees_messages() THEN
            RETURN send_unique.id;
        END IF;
        IF EXISTS (SELECT 1 FROM pgmb_message m WHERE m.id = send_unique.id) THEN
            RAISE EXCEPTION 'message % already exists', send_unique.id
                USING ERRCODE = 'unique_violation',
                      HINT = 'Message ids are unique; pass gen_random_uuid() for a new message.';
        END IF;
        live := pgmb.unique_live(send_unique.unique_key, send_unique.routing_key);
        IF live IS NOT NULL THEN
            RETURN live;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'unique key %: its live delivery kept changing; try again', quote_literal(unique_key)
        USING ERRCODE = 'lock_not_available';
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

-- pgmb.send with headers, due now.
CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT pgmb.send(id, routing_key, body, headers, NULL::timestamptz) $$;

-- pgmb.send of a body alone, due now.
CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT pgmb.send(id, routing_key, body, NULL::jsonb, NULL::timestamptz) $$;

-- The messages among these that no queue got: no binding matched their routing key when
-- they were published (routing happens once, at publish time).
CREATE OR REPLACE FUNCTION pgmb.unrouted(message_ids uuid[]) RETURNS SETOF uuid
LANGUAGE sql STABLE AS $$
    SELECT u.id FROM unnest(message_ids) WITH ORDINALITY AS u(id, n)
    WHERE EXISTS (SELECT 1 FROM pgmb_message m WHERE m.id = u.id)
      AND NOT EXISTS (SELECT 1 FROM pgmb_delivery d WHERE d.message_id = u.id)
      AND NOT EXISTS (SELECT 1 FROM pgmb_dead_letter x WHERE x.message_id = u.id)
      AND NOT EXISTS (SELECT 1 FROM pgmb_attempt a WHERE a.message_id = u.id)
    ORDER BY u.n
$$;

-- Registers a worker (an HTTP endpoint and its rate limit); returns its id.
CREATE OR REPLACE FUNCTION pgmb.worker(name text, endpoint text, rps integer) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    new_id uuid;
BEGIN
    -- Checked before the INSERT so an over-long name gets this message, not a varchar error.
    PERFORM pgmb.check_name('worker', worker.name);
    IF EXISTS (SELECT 1 FROM pgmb_worker w WHERE w.name = worker.name) THEN
        RAISE EXCEPTION 'worker % already exists', quote_literal(worker.name)
            USING ERRCODE = 'unique_violation';
    END IF;
    INSERT INTO pgmb_worker (name, endpoint, rps) VALUES (worker.name, worker.endpoint, worker.rps)
    RETURNING id INTO new_id;
    RETURN new_id;
END $$;

-- pgmb.create, and whether the queue keeps its history (pgmb_queue.keep_history, on by
-- default): off, a pull queue's pgmb.delete and pgmb.pop write no 'ack' row
-- (docs/decisions/0063-pull-queues-without-history.md). Only a pull queue may turn it off.
CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, max_retries integer, worker_id uuid,
                                       keep_history boolean)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    new_id uuid;
BEGIN
    PERFORM pgmb.check_name('queue', $1);
    PERFORM pgmb.compile_binding($2);
    IF worker_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pgmb_worker w WHERE w.id = worker_id) THEN
        RAISE EXCEPTION 'unknown worker id %', worker_id
            USING ERRCODE = 'foreign_key_violation',
                  HINT = 'Register the worker first: SELECT pgmb.worker(name, endpoint, rps); or pass NULL for a pull queue.';
    END IF;
    PERFORM pgmb.check_keep_history($1, $4, $5);
    INSERT INTO pgmb_queue (name, binding_key, pattern, worker_id, max_retries, keep_history)
    VALUES ($1, $2, '', $4, $3, $5)  -- "create" is a keyword, so no create.name
    RETURNING id INTO new_id;
    RETURN new_id;
END $$;

-- Turns a queue's history on or off (see pgmb.create above); returns the setting as it was.
-- Takes effect for the deletes that start after it commits.
CREATE OR REPLACE FUNCTION pgmb.set_keep_history(queue_name text, keep_history boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    worker uuid;
    was boolean;
BEGIN
    SELECT q.worker_id, q.keep_history INTO worker, was FROM pgmb_queue q WHERE q.name = queue_name
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue % does not exist', quote_literal(queue_name) USING ERRCODE = 'undefined_object';
    END IF;
    PERFORM pgmb.check_keep_history(queue_name, worker, keep_history);
    UPDATE pgmb_queue q SET keep_history = set_keep_history.keep_history
    WHERE q.name = queue_name AND q.keep_history IS DISTINCT FROM set_keep_history.keep_history;
    RETURN was;
END $$;

-- The rule of the constraint pgmb_queue_history_pull_only, with its own message.
CREATE OR REPLACE FUNCTION pgmb.check_keep_history(queue_name text, worker_id uuid, keep_history boolean)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF keep_history IS NULL THEN
        RAISE EXCEPTION 'invalid keep_history NULL for queue %: it must be true or false', quote_literal(queue_name)
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT keep_history AND worker_id IS NOT NULL THEN
        RAISE EXCEPTION 'queue % has a worker: only a pull queue may keep no history', quote_literal(queue_name)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A push queue''s history is what its delivered counts, replay and the worker''s health read.';
    END IF;
END $$;

-- Creates a queue; the documented argument order: (name, binding_key, max_retries,
-- worker_id). worker_id NULL makes a pull queue; an unknown worker id is an error.
-- Returns the queue's id. It keeps its history (the five-argument pgmb.create above).
CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, max_retries integer, worker_id uuid)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT pgmb.create(name, binding_key, max_retries, worker_id, true) $$;

-- The order the seed's Quick Start uses: (name, binding_key, worker_id, max_retries).
CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, worker_id uuid, max_retries integer)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT pgmb.create(name, binding_key, max_retries, worker_id) $$;

-- pgmb.send acts for its caller (pgmb.pin_definers, tables.sql): a producer role needs
-- pgmb_producer, no privilege on the tables.
SELECT pgmb.pin_definers(ARRAY[
    'pgmb.send(uuid, text, jsonb, jsonb, timestamptz, integer, text, uuid[], text, integer, float8)',
    'pgmb.send(uuid, text, jsonb, jsonb, timestamptz, float8, timestamptz, integer, text, uuid[], text, integer, float8)',
    'pgmb.send(uuid, text, jsonb, jsonb, integer)',
    'pgmb.send_unique(uuid, text, jsonb, text, text, jsonb, timestamptz, float8, timestamptz, integer, text, integer, float8)'
]);
