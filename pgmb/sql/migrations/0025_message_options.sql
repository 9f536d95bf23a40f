-- pgmb 0025: message options: priority, ordered groups, dependencies, de-duplication and
-- per-message retries (docs/ordering.md).
--
-- The columns are added by the Django migration (pgmb_message: priority, group_key,
-- depends_on, dedup_id, max_retries, retry_delay; pgmb_delivery: priority, group_key,
-- depends_on, dependents; pgmb_queue: dedup_window). This file holds the rules, the
-- indexes and the functions.
--
-- One new delivery state, 'waiting': a delivery that is not its group's head, or whose
-- dependencies are not settled. It becomes 'ready' when what it waits for leaves the hot
-- table (pgmb.promote_waiting, called by the row triggers on pgmb_delivery and
-- pgmb_dead_letter). Every reader of 'ready' rows (claims, the in-database loop, metrics)
-- therefore honours groups and dependencies without knowing about them. Messages without
-- options never reach any of this: the triggers have WHEN clauses on columns that are
-- NULL (or false) for them.

ALTER TABLE pgmb_delivery DROP CONSTRAINT pgmb_delivery_state_valid;
ALTER TABLE pgmb_delivery
    ADD CONSTRAINT pgmb_delivery_state_valid CHECK (state::text = ANY ('{ready,leased,waiting}'::text[]));

-- ---- the option rules -----------------------------------------------------------------

-- Why the options of a message are refused, or NULL. The same rules as
-- pgmb.options.check_options in Python (tests/rules holds one table of cases for both).
CREATE FUNCTION pgmb.message_options_problem(
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

CREATE FUNCTION pgmb.check_message_options(
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

-- Plain INSERTs get the same rules. NOT VALID: the existing rows have no options, and a
-- check that calls a pgmb function must come after the schema in a dump (schema.sql).
ALTER TABLE pgmb_message ADD CONSTRAINT pgmb_message_options_valid CHECK (
    (group_key IS NULL AND depends_on IS NULL AND dedup_id IS NULL AND max_retries IS NULL
     AND retry_delay IS NULL)
    OR pgmb.message_options_problem(id, priority, group_key, depends_on, dedup_id, max_retries,
                                    retry_delay) IS NULL) NOT VALID;

ALTER TABLE pgmb_queue ADD CONSTRAINT pgmb_queue_dedup_window_valid
    CHECK (dedup_window >= 0 AND dedup_window <= 2592000);

-- ---- indexes -------------------------------------------------------------------------

-- Claims take the most urgent first: priority, then due time, then publish order.
CREATE INDEX IF NOT EXISTS pgmb_delivery_due_priority
    ON pgmb_delivery (queue_id, priority, available_at, id) INCLUDE (attempts, created_at)
    WHERE state = 'ready';
DROP INDEX IF EXISTS pgmb_delivery_due;
ALTER INDEX pgmb_delivery_due_priority RENAME TO pgmb_delivery_due;

-- A group's members in publish order (its head first); rows without a group are not in it.
CREATE INDEX pgmb_delivery_group ON pgmb_delivery (queue_id, group_key, id)
    WHERE group_key IS NOT NULL;
-- Waiting deliveries by queue (the admin's queue filter); only waiting rows are in it.
CREATE INDEX pgmb_delivery_waiting ON pgmb_delivery (queue_id, id) WHERE state = 'waiting';
-- The waiting dependents of a message.
CREATE INDEX pgmb_delivery_depends_on ON pgmb_delivery USING gin (depends_on)
    WHERE depends_on IS NOT NULL;
-- Recent messages of a de-duplication id.
CREATE INDEX pgmb_message_dedup ON pgmb_message (dedup_id, created_at)
    WHERE dedup_id IS NOT NULL;

-- ---- admitting messages (dependencies exist, duplicates dropped) ----------------------

-- Before each message with dependencies or a de-duplication id is stored. Returns NULL
-- (the row is not stored) for a duplicate: a message with the same dedup id published
-- within the dedup window of a queue that this one's routing key matches (the longest
-- window of those queues). Rows published earlier in the same statement are visible here.
CREATE FUNCTION pgmb.admit_message(m pgmb_message) RETURNS pgmb_message
LANGUAGE plpgsql AS $$
DECLARE
    missing uuid;
    window_seconds float8;
BEGIN
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

-- The message a duplicate was dropped for: the newest with this dedup id.
CREATE FUNCTION pgmb.deduplicated(dedup_id text) RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT m.id FROM pgmb_message m WHERE m.dedup_id = deduplicated.dedup_id
    ORDER BY m.created_at DESC, m.id DESC LIMIT 1
$$;

-- ---- waiting deliveries ----------------------------------------------------------------

-- Whether a delivery must wait: an earlier live delivery of its group on its queue, or a
-- dependency with a live delivery or a dead letter anywhere.
CREATE FUNCTION pgmb.delivery_blocked(delivery_id bigint, queue_id uuid, group_key text, depends_on uuid[])
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
CREATE FUNCTION pgmb.hold_delivery(d pgmb_delivery) RETURNS pgmb_delivery
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
CREATE FUNCTION pgmb.has_dependents(message_id uuid) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT FROM pgmb_delivery w
                   WHERE w.depends_on @> ARRAY[has_dependents.message_id] AND w.state = 'waiting')
$$;

-- Make these waiting deliveries ready where nothing holds them any more.
CREATE FUNCTION pgmb.promote_waiting(delivery_ids bigint[]) RETURNS integer
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

-- After a delivery with a group or dependents leaves the hot table (acked, dead-lettered,
-- its queue deleted): its group's new head, and the deliveries that depend on its message.
CREATE FUNCTION pgmb.release_after(d pgmb_delivery) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmb.promote_waiting(
        ARRAY(SELECT h.id FROM pgmb_delivery h
              WHERE d.group_key IS NOT NULL AND h.queue_id = d.queue_id AND h.group_key = d.group_key
              ORDER BY h.id LIMIT 1)
        || ARRAY(SELECT w.id FROM pgmb_delivery w
                 WHERE d.dependents AND w.depends_on @> ARRAY[d.message_id] AND w.state = 'waiting'));
END $$;

-- After a dead letter leaves (purged, requeued, its queue deleted): the deliveries that
-- depend on its message (a requeued dependency is live again and keeps them waiting).
CREATE FUNCTION pgmb.release_dependents(message_id uuid) RETURNS void
LANGUAGE sql AS $$
    SELECT pgmb.promote_waiting(ARRAY(
        SELECT w.id FROM pgmb_delivery w
        WHERE w.depends_on @> ARRAY[release_dependents.message_id] AND w.state = 'waiting'))
$$;

-- ---- publishing ------------------------------------------------------------------------

-- The SQL API with options: pgmb.send(id, routing_key, body, headers, delay, priority =>,
-- group_key =>, depends_on =>, dedup_id =>, max_retries =>, retry_delay =>). It replaces
-- the five-argument form with a time, which every shorter form calls; calls of that form
-- resolve to it unchanged. Returns the message's id, or for a duplicate the id of the
-- message it duplicates.
DROP FUNCTION pgmb.send(uuid, text, jsonb, jsonb, timestamptz);
CREATE FUNCTION pgmb.send(
    id uuid, routing_key text, body jsonb, headers jsonb, delay timestamptz,
    priority integer DEFAULT 0, group_key text DEFAULT NULL, depends_on uuid[] DEFAULT NULL,
    dedup_id text DEFAULT NULL, max_retries integer DEFAULT NULL, retry_delay float8 DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    stored uuid;
BEGIN
    PERFORM pgmb.require('publish');  -- access control (0021)
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

-- Acting for its caller, as 0021 made the form it replaces.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION pgmb.send(uuid, text, jsonb, jsonb, timestamptz, integer, text, uuid[], text, integer, float8) '
                   'SECURITY DEFINER SET search_path = %I, pg_temp',
                   (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE c.oid = 'pgmb_message'::regclass));
END $$;

-- ---- claims: the most urgent first ----------------------------------------------------

-- The first due time of a queue's ready deliveries, and whether one is due by a time: one
-- probe of the claim index per priority in use (it leads with priority, so the queue's
-- first entry is only the earliest of its most urgent priority). Reading the entries
-- instead would read every delayed one. PL/pgSQL: its plans are kept for the session.
CREATE FUNCTION pgmb.next_due(queue_id uuid, due_by timestamptz DEFAULT NULL) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    lvl smallint;
    due timestamptz;
    earliest timestamptz;
BEGIN
    SELECT d.priority, d.available_at INTO lvl, earliest FROM pgmb_delivery d
    WHERE d.queue_id = next_due.queue_id AND d.state = 'ready'
    ORDER BY d.priority, d.available_at LIMIT 1;
    LOOP
        -- With due_by: any due time not after it will do (the claim asks only that).
        EXIT WHEN lvl IS NULL OR earliest <= due_by;
        SELECT d.priority, d.available_at INTO lvl, due FROM pgmb_delivery d
        WHERE d.queue_id = next_due.queue_id AND d.state = 'ready' AND d.priority > lvl
        ORDER BY d.priority, d.available_at LIMIT 1;
        EXIT WHEN NOT FOUND;
        earliest := least(earliest, due);
    END LOOP;
    RETURN earliest;
END $$;

-- As in 0022 (with its circuit breaker), with: deliveries in order of priority, due time,
-- id; the row lock FOR NO KEY UPDATE (a publisher holding a group's head FOR KEY SHARE does
-- not make claims skip it); max_attempts from the message's own max_retries when it has
-- one; the due test per priority (pgmb.next_due).
CREATE OR REPLACE FUNCTION pgmb.claim(queue_names text[] DEFAULT NULL, max_count integer DEFAULT 100)
RETURNS SETOF pgmb.claimed
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := clock_timestamp();
    lease uuid := gen_random_uuid();
    remaining integer := max_count;
    w record;
    q uuid;
    tokens integer;
    got integer;
    breaker text;
BEGIN
    FOR w IN
        SELECT wk.id, array_agg(qu.id ORDER BY random()) AS queue_ids
        FROM pgmb_queue qu JOIN pgmb_worker wk ON wk.id = qu.worker_id
        WHERE NOT qu.paused AND wk.active
          AND (wk.breaker_until IS NULL OR wk.breaker_until <= t)  -- an open circuit breaker (0022)
          AND (queue_names IS NULL OR qu.name = ANY (queue_names))
          -- The queue's first entry (its most urgent priority's earliest) is due, mostly;
          -- if not, one probe per further priority (pgmb.next_due).
          AND CASE WHEN (SELECT d.available_at FROM pgmb_delivery d
                         WHERE d.queue_id = qu.id AND d.state = 'ready'
                         ORDER BY d.priority, d.available_at LIMIT 1) <= t THEN true
                   ELSE pgmb.next_due(qu.id, t) <= t END
        GROUP BY wk.id
        ORDER BY random()
    LOOP
        EXIT WHEN remaining <= 0;
        -- The bucket is the worker row. If another claim holds it right now, that claim is
        -- serving this worker: skip it rather than wait (as with deliveries).
        PERFORM 1 FROM pgmb_worker wk WHERE wk.id = w.id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        UPDATE pgmb_worker wk
        SET tokens = least(greatest(1, wk.rps * wk.burst),
                           wk.tokens + wk.rps * extract(epoch FROM t - coalesce(wk.tokens_at, t - interval '1 day'))),
            tokens_at = t
        WHERE wk.id = w.id
        RETURNING floor(wk.tokens)::integer, wk.breaker_state INTO tokens, breaker;
        tokens := least(tokens, remaining);
        -- Circuit breaker (0022): open, nothing; after its cool-down, one delivery (the probe).
        IF breaker <> 'closed' THEN tokens := pgmb.breaker_admit(w.id, tokens, t, lease); END IF;
        CONTINUE WHEN tokens <= 0;
        -- Queue by queue, so each claim is an ordered scan of one queue's partial index.
        FOREACH q IN ARRAY w.queue_ids LOOP
            EXIT WHEN tokens <= 0;
            RETURN QUERY
            WITH picked AS (
                SELECT d.id FROM pgmb_delivery d
                WHERE d.queue_id = q AND d.state = 'ready' AND d.available_at <= t
                ORDER BY d.priority, d.available_at, d.id
                LIMIT tokens
                FOR NO KEY UPDATE SKIP LOCKED
            ), leased AS (
                -- The attempt is counted now and handed back if the lease expires unstarted.
                UPDATE pgmb_delivery d
                SET state = 'leased', attempts = d.attempts + 1, lease_id = lease, started = false,
                    available_at = t + least(qu.lease_seconds, 2592000) * interval '1 second'
                FROM picked, pgmb_queue qu
                WHERE d.id = picked.id AND qu.id = d.queue_id
                RETURNING d.id, d.attempts, qu.max_retries, d.queue_id, qu.name,
                          d.message_id, qu.lease_seconds
            )
            SELECT l.id, lease, l.attempts, 1 + coalesce(m.max_retries, l.max_retries), l.queue_id,
                   l.name::text, m.id, m.routing_key::text, m.body::text, m.headers, m.created_at,
                   wk.id, wk.endpoint::text, wk.timeout, wk.secret::text, wk.rps, l.lease_seconds
            FROM leased l
            JOIN pgmb_message m ON m.id = l.message_id
            JOIN pgmb_worker wk ON wk.id = w.id;
            GET DIAGNOSTICS got = ROW_COUNT;
            tokens := tokens - got;
            remaining := remaining - got;
            UPDATE pgmb_worker wk SET tokens = wk.tokens - got WHERE wk.id = w.id AND got > 0;
        END LOOP;
    END LOOP;
END $$;

-- As in 0022 (waiting for a circuit breaker's cool-down), with the first due time per
-- priority (pgmb.next_due).
CREATE OR REPLACE FUNCTION pgmb.next_wakeup(queue_names text[]) RETURNS float8
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT CASE WHEN min(at) IS NOT NULL
                THEN greatest(0, extract(epoch FROM min(at) - clock_timestamp()))::float8 END
    FROM (
        SELECT CASE WHEN due IS NOT NULL
                    THEN greatest(due, tokens_at + (1 - least(tokens, 1)) / rps * interval '1 second', breaker_until)
               END AS at
        FROM (
            SELECT pgmb.next_due(qu.id) AS due,
                   wk.tokens, coalesce(wk.tokens_at, '-infinity') AS tokens_at, wk.rps, wk.breaker_until
            FROM pgmb_queue qu JOIN pgmb_worker wk ON wk.id = qu.worker_id
            WHERE NOT qu.paused AND wk.active AND (queue_names IS NULL OR qu.name = ANY (queue_names))
        ) AS per_queue
        UNION ALL
        SELECT min(d.available_at) FROM pgmb_delivery d JOIN pgmb_queue qu ON qu.id = d.queue_id
        WHERE d.state = 'leased' AND (queue_names IS NULL OR qu.name = ANY (queue_names))
    ) AS candidates);
END $$;

-- ---- failures: the message's own retries ------------------------------------------------

-- As in 0022 (reporting to the circuit breakers), with the message's max_retries and
-- retry_delay (a fixed delay, at least the worker's Retry-After) in place of the queue's
-- when it has them.
CREATE OR REPLACE FUNCTION pgmb.settle_failures(
    delivery_ids bigint[], lease_ids uuid[], statuses integer[], errors text[],
    retry_after float8[], durations_ms float8[], retry_outcome text
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    settled integer;
BEGIN
    PERFORM pgmb.breaker_settle(delivery_ids, lease_ids, statuses, errors, false);  -- circuit breakers (0022)
    WITH input AS (
        SELECT * FROM unnest(delivery_ids, lease_ids, statuses, errors, retry_after, durations_ms)
            AS u(id, lease_id, status, error, retry_after, duration_ms)
    ), target AS (
        SELECT d.id, d.message_id, d.queue_id, d.attempts, u.status, left(coalesce(u.error, ''), 2000) AS error,
               u.retry_after, u.duration_ms,
               d.attempts >= 1 + coalesce(m.max_retries, q.max_retries) AS exhausted,
               q.backoff_base, q.backoff_max, m.retry_delay
        FROM input u
        JOIN pgmb_delivery d ON d.id = u.id AND d.lease_id = u.lease_id AND d.state = 'leased'
        JOIN pgmb_queue q ON q.id = d.queue_id
        JOIN pgmb_message m ON m.id = d.message_id
        FOR UPDATE OF d
    ), dead AS (
        DELETE FROM pgmb_delivery d USING target t WHERE d.id = t.id AND t.exhausted
        RETURNING d.id
    ), buried AS (
        INSERT INTO pgmb_dead_letter (message_id, queue_id, attempts, last_status, last_error, created_at)
        SELECT t.message_id, t.queue_id, t.attempts, t.status, t.error, clock_timestamp()
        FROM target t JOIN dead ON dead.id = t.id
        ON CONFLICT (message_id, queue_id) DO UPDATE
        SET attempts = excluded.attempts, last_status = excluded.last_status,
            last_error = excluded.last_error, created_at = excluded.created_at
        RETURNING 1
    ), retried AS (
        UPDATE pgmb_delivery d
        SET state = 'ready', lease_id = NULL, last_status = t.status, last_error = t.error,
            available_at = clock_timestamp()
                + CASE WHEN t.retry_delay IS NOT NULL
                       THEN greatest(least(coalesce(t.retry_after, 0), 86400), t.retry_delay)
                       ELSE pgmb.retry_delay(t.attempts, t.backoff_base, t.backoff_max, t.retry_after)
                  END * interval '1 second'
        FROM target t
        WHERE d.id = t.id AND NOT t.exhausted
        RETURNING 1
    ), history AS (
        INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
        SELECT t.message_id, t.queue_id, t.attempts, CASE WHEN t.exhausted THEN 'dead' ELSE retry_outcome END,
               t.status, t.duration_ms, t.error, clock_timestamp()
        FROM target t
        RETURNING 1
    )
    -- Data-modifying CTEs always run to completion, read or not.
    SELECT count(*)::integer INTO settled FROM history;
    RETURN settled;
END $$;

-- ---- requeue and replay carry the message's options ------------------------------------

-- As in 0002, with the message's priority, group and dependencies. A requeued delivery
-- gets a new id: in its group it goes behind the members already there (docs/ordering.md).
CREATE OR REPLACE FUNCTION pgmb.requeue(dead_letter_ids bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    WITH moved AS (
        DELETE FROM pgmb_dead_letter x WHERE x.id = ANY (dead_letter_ids)
        RETURNING x.message_id, x.queue_id
    )
    INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at, created_at,
                               priority, group_key, depends_on, dependents)
    SELECT moved.message_id, moved.queue_id, 'ready', 0, now(), now(),
           m.priority, m.group_key, m.depends_on, pgmb.has_dependents(m.id)
    FROM moved JOIN pgmb_message m ON m.id = moved.message_id
    ORDER BY moved.message_id
    ON CONFLICT (message_id, queue_id) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM pg_notify('pgmb', '');
    END IF;
    RETURN n;
END $$;

-- As in 0015, with the message's priority, group and dependencies.
CREATE OR REPLACE FUNCTION pgmb.replay(message_ids uuid[], queue_names text[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(pgmb.archive_lock_key('claim'));
    INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at, created_at,
                               priority, group_key, depends_on, dependents)
    SELECT acked.message_id, acked.queue_id, 'ready', 0, now(), now(),
           m.priority, m.group_key, m.depends_on, pgmb.has_dependents(m.id)
    FROM (
        SELECT DISTINCT a.message_id, a.queue_id
        FROM pgmb_attempt a
        WHERE a.message_id = ANY (message_ids) AND a.outcome = 'ack'
    ) AS acked
    JOIN pgmb_message m ON m.id = acked.message_id
    JOIN pgmb_queue q ON q.id = acked.queue_id
    WHERE (queue_names IS NULL OR q.name = ANY (queue_names))
      AND NOT EXISTS (SELECT FROM pgmb_dead_letter x
                      WHERE x.message_id = acked.message_id AND x.queue_id = acked.queue_id)
      AND NOT EXISTS (SELECT FROM pgmb_archive_item i WHERE i.message_id = acked.message_id)
    ORDER BY acked.message_id, acked.queue_id
    ON CONFLICT (message_id, queue_id) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM pg_notify('pgmb', '');
    END IF;
    RETURN n;
END $$;

-- ---- views ----------------------------------------------------------------------------

-- As in 0001, with 'waiting' shown as such.
CREATE OR REPLACE VIEW pgmb.queue_entries AS
SELECT d.queue_id, q.name AS queue, d.message_id, m.routing_key, m.body, m.headers,
       CASE WHEN d.state = 'waiting' THEN 'waiting'
            WHEN d.available_at <= now() THEN 'ready'
            WHEN d.state = 'leased' THEN 'leased'
            ELSE 'delayed' END AS state,
       false AS acknoledge, false AS acknowledged,
       d.attempts, d.available_at AS enqueued_at, m.created_at, NULL::timestamptz AS acknowledged_at
FROM pgmb_delivery d
JOIN pgmb_queue q ON q.id = d.queue_id
JOIN pgmb_message m ON m.id = d.message_id
UNION ALL
SELECT a.queue_id, q.name, a.message_id, m.routing_key, m.body, m.headers,
       'acked', true, true, a.attempt, NULL, m.created_at, a.created_at
FROM pgmb_attempt a
JOIN pgmb_queue q ON q.id = a.queue_id
JOIN pgmb_message m ON m.id = a.message_id
WHERE a.outcome = 'ack';

-- As in 0023 (an archived message is neither delivered nor failed), with waiting
-- deliveries in queue_length and total_messages (the leased part's scan also reads the
-- small partial index pgmb_delivery_waiting).
CREATE OR REPLACE FUNCTION pgmb.metrics_all() RETURNS SETOF pgmb.queue_metrics
    LANGUAGE sql STABLE
    AS $$
    SELECT q.name::text,
           r.n + coalesce(l.n, 0) + coalesce(l.waiting, 0),
           r.due,
           extract(epoch FROM now() - greatest(r.newest, l.newest))::float8,
           extract(epoch FROM now() - r.oldest_due)::float8,
           r.n + coalesce(l.n, 0) + coalesce(l.waiting, 0) + x.n + a.n,
           coalesce(l.n, 0),
           r.retrying,
           x.n,
           coalesce(h.delivered, 0),
           coalesce(h.failed, 0),
           q.paused,
           now()
    FROM pgmb_queue q
    CROSS JOIN LATERAL (
        SELECT count(*) AS n,
               count(*) FILTER (WHERE d.available_at <= now()) AS due,
               count(*) FILTER (WHERE d.attempts > 0) AS retrying,
               max(d.created_at) AS newest,
               min(d.created_at) FILTER (WHERE d.available_at <= now()) AS oldest_due
        FROM pgmb_delivery d WHERE d.queue_id = q.id AND d.state = 'ready'
    ) r
    CROSS JOIN LATERAL (SELECT count(*) AS n FROM pgmb_dead_letter x WHERE x.queue_id = q.id) x
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM pgmb_attempt a WHERE a.queue_id = q.id AND a.outcome = 'ack'
    ) a
    LEFT JOIN (
        SELECT d.queue_id, count(*) FILTER (WHERE d.state = 'leased') AS n,
               count(*) FILTER (WHERE d.state = 'waiting') AS waiting,
               max(d.created_at) AS newest
        FROM pgmb_delivery d WHERE d.state = 'leased' OR d.state = 'waiting' GROUP BY d.queue_id
    ) l ON l.queue_id = q.id
    LEFT JOIN (
        SELECT a.queue_id,
               count(*) FILTER (WHERE a.outcome = 'ack') AS delivered,
               count(*) FILTER (WHERE a.outcome NOT IN ('ack', 'unsent', 'archived')) AS failed
        FROM pgmb_attempt a WHERE a.created_at > now() - interval '1 hour' GROUP BY a.queue_id
    ) h ON h.queue_id = q.id
    ORDER BY q.name
$$;

-- As in 0001, without waiting deliveries: one held by a dead-lettered dependency has
-- nothing to do (`pgmb_dispatch --until-idle` would never stop), and one behind a live
-- delivery is busy through that one.
CREATE OR REPLACE FUNCTION pgmb.busy(queue_names text[]) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT EXISTS (
        SELECT 1 FROM pgmb_delivery d JOIN pgmb_queue qu ON qu.id = d.queue_id
        JOIN pgmb_worker wk ON wk.id = qu.worker_id
        WHERE (queue_names IS NULL OR qu.name = ANY (queue_names))
          AND NOT qu.paused AND wk.active
          AND (d.state = 'leased'
               OR (d.state = 'ready' AND (d.attempts > 0 OR d.available_at <= clock_timestamp())))
    )
$$;

-- ---- pull reads: the most urgent first, the message's own retries ----------------------

-- As in 0023, in order of priority, due time, id (the claim index leads with priority),
-- returned in that order, and read number 2 + the message's own max_retries, when it has
-- one, dead-letters instead.
CREATE OR REPLACE FUNCTION pgmb.read(queue_name text, vt double precision, qty integer, filter jsonb DEFAULT NULL::jsonb) RETURNS SETOF pgmb.pull_message
    LANGUAGE plpgsql
    AS $$
DECLARE
    q record;
    t timestamptz := clock_timestamp();
    body_filter jsonb := filter -> 'body';
    headers_filter jsonb := filter -> 'headers';
    remaining integer := qty;
    got pgmb.pull_message[];
    buried integer;
    seen bigint[] := '{}';
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    PERFORM pgmb.check_pull_args(vt, qty, filter);
    IF q.paused THEN
        RETURN;
    END IF;
    LOOP
        -- One ordered scan of the queue's part of pgmb_delivery_due, as a push claim's. A
        -- delivery read 1 + max_retries times already is dead-lettered instead, in the same
        -- statement, as pgmb.settle_failures does with push failures.
        WITH picked AS (
            -- A first read cannot be the last one: only a delivery read before looks up its
            -- message's own max_retries.
            SELECT d.id, d.available_at AS was, lim.max_retries,
                   d.attempts >= 1 + coalesce(lim.max_retries, 0) AND lim.max_retries IS NOT NULL AS exhausted
            FROM pgmb_delivery d
            CROSS JOIN LATERAL (
                SELECT CASE WHEN d.attempts = 0 THEN NULL
                            ELSE coalesce((SELECT m.max_retries FROM pgmb_message m WHERE m.id = d.message_id),
                                          q.max_retries) END AS max_retries
            ) AS lim
            WHERE d.queue_id = q.id AND d.state = 'ready' AND d.available_at <= t
              AND d.id <> ALL (seen)
              AND (filter IS NULL
                   OR EXISTS (SELECT 1 FROM pgmb_message m
                              WHERE m.id = d.message_id
                                AND (body_filter IS NULL OR m.body @> body_filter)
                                AND (headers_filter IS NULL OR m.headers @> headers_filter)))
            ORDER BY d.priority, d.available_at, d.id
            LIMIT remaining
            FOR UPDATE OF d SKIP LOCKED
        ), dead AS (
            DELETE FROM pgmb_delivery d USING picked p WHERE d.id = p.id AND p.exhausted
            RETURNING d.message_id, d.queue_id, d.attempts, d.last_status,
                      format('read %s times and never deleted (max_retries %s): dead-lettered instead of read again',
                             d.attempts, p.max_retries) AS error
        ), dead_letters AS (
            INSERT INTO pgmb_dead_letter (message_id, queue_id, attempts, last_status, last_error, created_at)
            SELECT x.message_id, x.queue_id, x.attempts, x.last_status, x.error, clock_timestamp()
            FROM dead x
            ON CONFLICT (message_id, queue_id) DO UPDATE
            SET attempts = excluded.attempts, last_status = excluded.last_status,
                last_error = excluded.last_error, created_at = excluded.created_at
        ), history AS (
            INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
            SELECT x.message_id, x.queue_id, x.attempts, 'dead', NULL, NULL, x.error, clock_timestamp()
            FROM dead x
            RETURNING 1
        ), r AS (
            UPDATE pgmb_delivery d
            SET attempts = d.attempts + 1, available_at = t + make_interval(secs => vt)
            FROM picked p
            WHERE d.id = p.id AND NOT p.exhausted
            RETURNING d.id, d.message_id, d.attempts, d.created_at, d.available_at, p.was, d.priority
        )
        SELECT array_agg(ROW(r.id, r.message_id, r.attempts, r.created_at, r.available_at,
                             m.body, m.headers, m.routing_key)::pgmb.pull_message
                         ORDER BY r.priority, r.was, r.id),
               (SELECT count(*) FROM history)
        INTO got, buried
        FROM r JOIN pgmb_message m ON m.id = r.message_id;
        IF got IS NOT NULL THEN
            RETURN QUERY SELECT * FROM unnest(got);
            remaining := remaining - cardinality(got);
        END IF;
        -- Only dead-lettered rows make room for more in the same read.
        EXIT WHEN buried = 0 OR remaining <= 0;
        seen := seen || ARRAY(SELECT g.delivery_id FROM unnest(got) AS g);
    END LOOP;
END $$;

-- As in 0023, with the message's max_retries and retry_delay (a fixed delay) in place of
-- the queue's when it has them.
CREATE OR REPLACE FUNCTION pgmb.nack(queue_name text, delivery_ids bigint[], read_counts integer[], errors text[] DEFAULT NULL::text[]) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    q record;
    settled integer;
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    PERFORM pgmb.check_pull_ids(queue_name, q.id, delivery_ids);
    IF cardinality(delivery_ids) IS DISTINCT FROM cardinality(read_counts)
       OR (errors IS NOT NULL AND cardinality(errors) <> cardinality(delivery_ids)) THEN
        RAISE EXCEPTION 'pgmb.nack needs one read count (and one error, if any) per message id (% ids, % read counts, % errors)',
                        cardinality(delivery_ids), coalesce(cardinality(read_counts), 0), coalesce(cardinality(errors), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH input AS (
        SELECT u.id, u.read_ct, left(coalesce(u.error, ''), 2000) AS error
        FROM unnest(delivery_ids, read_counts, coalesce(errors, array_fill(NULL::text, ARRAY[cardinality(delivery_ids)])))
            AS u(id, read_ct, error)
    ), target AS (
        SELECT d.id, d.message_id, d.queue_id, d.attempts, u.error,
               d.attempts >= 1 + coalesce(m.max_retries, qu.max_retries) AS exhausted,
               qu.backoff_base, qu.backoff_max, m.retry_delay
        FROM input u
        JOIN pgmb_delivery d ON d.id = u.id AND d.attempts = u.read_ct AND d.state = 'ready'
        JOIN pgmb_queue qu ON qu.id = d.queue_id AND qu.id = q.id
        JOIN pgmb_message m ON m.id = d.message_id
        FOR UPDATE OF d
    ), dead AS (
        DELETE FROM pgmb_delivery d USING target t WHERE d.id = t.id AND t.exhausted
        RETURNING d.id
    ), buried AS (
        INSERT INTO pgmb_dead_letter (message_id, queue_id, attempts, last_status, last_error, created_at)
        SELECT t.message_id, t.queue_id, t.attempts, NULL, t.error, clock_timestamp()
        FROM target t JOIN dead ON dead.id = t.id
        ON CONFLICT (message_id, queue_id) DO UPDATE
        SET attempts = excluded.attempts, last_status = excluded.last_status,
            last_error = excluded.last_error, created_at = excluded.created_at
        RETURNING 1
    ), retried AS (
        UPDATE pgmb_delivery d
        SET last_status = NULL, last_error = t.error,
            available_at = clock_timestamp()
                + coalesce(t.retry_delay, pgmb.retry_delay(t.attempts, t.backoff_base, t.backoff_max))
                  * interval '1 second'
        FROM target t
        WHERE d.id = t.id AND NOT t.exhausted
        RETURNING 1
    ), history AS (
        INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
        SELECT t.message_id, t.queue_id, t.attempts, CASE WHEN t.exhausted THEN 'dead' ELSE 'retry' END,
               NULL, NULL, t.error, clock_timestamp()
        FROM target t
        RETURNING 1
    )
    SELECT count(*)::integer INTO settled FROM history;
    RETURN settled;
END $$;

-- As in 0023, with the first due time per priority.
CREATE OR REPLACE FUNCTION pgmb.pull_next_visible(queue_name text) RETURNS double precision
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    q record;
    due timestamptz;
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    IF q.paused THEN
        RETURN NULL;
    END IF;
    -- The claim index leads with priority: one probe per priority in use (pgmb.next_due),
    -- not a scan of every entry for their minimum.
    due := pgmb.next_due(q.id);
    RETURN CASE WHEN due IS NOT NULL THEN greatest(0, extract(epoch FROM due - clock_timestamp()))::float8 END;
END $$;

-- The three act for their caller again (CREATE OR REPLACE resets that), as 0023 made them.
DO $$
DECLARE
    tables name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE c.oid = 'pgmb_message'::regclass);
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['pgmb.read(text, double precision, integer, jsonb)',
                             'pgmb.nack(text, bigint[], integer[], text[])',
                             'pgmb.pull_next_visible(text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp', f, tables);
    END LOOP;
END $$;
