-- Pull queues, consumed by clients (SQS/PGMQ style) instead of a worker.
--
-- A pull queue is a queue row without a worker (worker_id NULL). Routing fills it like any
-- other; push claims never see it (pgmb.claim, busy and next_wakeup join the worker). A
-- client reads from it: a read leaves the delivery 'ready', counts it (attempts = read_ct)
-- and moves available_at to the end of the visibility timeout, so the same index scan of
-- pgmb_delivery_due that finds new messages finds one whose timeout ran out, with no
-- dispatcher running, and pgmb.reclaim_expired (leased rows only) never sees a read
-- (docs/decisions/0014-pull-queues-in-the-same-tables.md). A read that would be number 2 + max_retries dead-letters the
-- delivery instead. Deleting is an ack ('ack' in the history), archiving records its own
-- outcome ('archived'), nack (a failed handler) schedules a retry.

-- The pull queue named queue_name (its id, max_retries, whether it is paused), or an error.
-- Every entry point comes here first: a role may consume only the queues granted to it
-- (access control, access.sql), and is refused before anything is read or written. The
-- access is checked before anything else is said about the queue: a role that may not
-- consume it gets the same refusal whether it exists or not, is a pull queue or not
-- (docs/decisions/0039-refusals-tell-nothing.md).
CREATE OR REPLACE FUNCTION pgmb.pull_queue(queue_name text, OUT id uuid, OUT max_retries integer, OUT paused boolean)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    worker text;
BEGIN
    -- Before any comparison a planted operator could match (tables.sql).
    PERFORM pgmb.refuse_writable_schemas();
    SELECT q.id, q.max_retries, q.paused, w.name INTO id, max_retries, paused, worker
    FROM pgmb_queue q LEFT JOIN pgmb_worker w ON w.id = q.worker_id
    WHERE q.name = queue_name;
    IF id IS NULL OR NOT pgmb.may('consume', id) THEN
        -- Raises: "does not exist" only to a role that may consume every queue.
        PERFORM pgmb.require('consume', queue_name);
    END IF;
    IF worker IS NOT NULL THEN
        -- The worker is named to administrators only: a consumer granted a push queue
        -- has no business with its worker.
        RAISE EXCEPTION 'queue % is not a pull queue: %', quote_literal(queue_name),
                        CASE WHEN pgmb.may('administer') THEN format('worker %L receives its messages', worker)
                             ELSE 'a worker receives its messages' END
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'Clients read only from queues without a worker: pgmb.create(name, binding_key, max_retries, NULL).';
    END IF;
END $$;

-- The checks of a read's arguments, each with its own message.
CREATE OR REPLACE FUNCTION pgmb.check_pull_args(vt double precision, qty integer, filter jsonb)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    extra text;
BEGIN
    -- NaN compares above every number, so the upper bound also refuses it.
    IF vt IS NULL OR vt < 0 OR vt > 2592000 THEN
        RAISE EXCEPTION 'invalid visibility timeout %: it must be from 0 to 2592000 seconds (30 days)', coalesce(vt::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF qty IS NULL OR qty < 1 OR qty > 10000 THEN
        RAISE EXCEPTION 'invalid qty %: it must be from 1 to 10000 messages', coalesce(qty::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF filter IS NULL THEN
        RETURN;
    END IF;
    IF jsonb_typeof(filter) <> 'object' THEN
        RAISE EXCEPTION 'invalid filter: it must be a JSON object, not %', jsonb_typeof(filter)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use {"body": ..., "headers": {...}}: a message matches when its body contains "body" and its headers contain "headers" (jsonb @>).';
    END IF;
    SELECT string_agg(quote_literal(k), ', ') INTO extra
    FROM jsonb_object_keys(filter) AS k WHERE k NOT IN ('body', 'headers');
    IF extra IS NOT NULL THEN
        RAISE EXCEPTION 'invalid filter: unknown key %', extra
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A filter has "body" and/or "headers": {"body": {"kind": "order"}} matches bodies containing {"kind": "order"}.';
    END IF;
    IF filter ? 'headers' AND jsonb_typeof(filter -> 'headers') <> 'object' THEN
        RAISE EXCEPTION 'invalid filter: "headers" must be a JSON object, not %', jsonb_typeof(filter -> 'headers')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- Deliveries among delivery_ids that exist but belong to another queue than queue_id, one
-- the caller may consume too: an error, before anything is written. Ids that do not exist
-- (settled already) are skipped, and so are those of queues the caller may not consume,
-- which it must not learn about (docs/decisions/0039-refusals-tell-nothing.md).
CREATE OR REPLACE FUNCTION pgmb.check_pull_ids(queue_name text, queue_id uuid, delivery_ids bigint[])
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    foreign_ids text;
BEGIN
    IF delivery_ids IS NULL OR array_position(delivery_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'invalid message ids: NULL is not a message id'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT string_agg(d.id::text, ', ' ORDER BY d.id) INTO foreign_ids
    FROM pgmb_delivery d
    WHERE d.id = ANY (delivery_ids) AND d.queue_id <> check_pull_ids.queue_id
      AND pgmb.may('consume', d.queue_id);
    IF foreign_ids IS NOT NULL THEN
        RAISE EXCEPTION 'messages % are not in queue %', foreign_ids, quote_literal(queue_name)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A message id is the delivery id a read of this queue returned.';
    END IF;
END $$;

-- pgmb.read that waits up to max_poll_seconds, polling every poll_interval_ms, until
-- something can be read (PGMQ's read_with_poll).
CREATE OR REPLACE FUNCTION pgmb.read_with_poll(queue_name text, vt double precision, qty integer,
                                    max_poll_seconds double precision DEFAULT 5,
                                    poll_interval_ms integer DEFAULT 100,
                                    filter jsonb DEFAULT NULL)
RETURNS SETOF pgmb.pull_message LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz;
BEGIN
    PERFORM pgmb.refuse_writable_schemas();  -- first (tables.sql)
    IF max_poll_seconds IS NULL OR max_poll_seconds < 0 OR max_poll_seconds > 3600 THEN
        RAISE EXCEPTION 'invalid max_poll_seconds %: it must be from 0 to 3600', coalesce(max_poll_seconds::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF poll_interval_ms IS NULL OR poll_interval_ms < 1 OR poll_interval_ms > 60000 THEN
        RAISE EXCEPTION 'invalid poll_interval_ms %: it must be from 1 to 60000', coalesce(poll_interval_ms::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    deadline := clock_timestamp() + make_interval(secs => max_poll_seconds);
    LOOP
        RETURN QUERY SELECT * FROM pgmb.read(queue_name, vt, qty, filter);
        EXIT WHEN FOUND OR clock_timestamp() >= deadline;
        PERFORM pg_sleep(least(poll_interval_ms / 1000.0,
                               greatest(extract(epoch FROM deadline - clock_timestamp()), 0)));
    END LOOP;
END $$;

-- Settles read deliveries of one pull queue: deleted from the hot table, one history row
-- each with outcome ('ack' or 'archived'). Returns the ids settled. Ids of another queue
-- are an error; as it is raised after the delete, the delete is undone with the statement,
-- and the common case pays no second look-up. A queue that keeps no history (its
-- keep_history off) writes no 'ack' row: its delete only deletes, as PGMQ's does; an
-- archive is always recorded, as it is the only trace of an archived message
-- (docs/decisions/0063-pull-queues-without-history.md).
CREATE OR REPLACE FUNCTION pgmb.settle_reads(queue_name text, delivery_ids bigint[], outcome text)
RETURNS SETOF bigint LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
AS $$
DECLARE
    q record;
    done integer;
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    -- The ids go straight to the caller (RETURN QUERY), as pgmb.read's rows do.
    IF outcome = 'ack' AND NOT (SELECT qu.keep_history FROM pgmb_queue qu WHERE qu.id = q.id) THEN
        RETURN QUERY
        DELETE FROM pgmb_delivery d
        WHERE d.id = ANY (delivery_ids) AND d.queue_id = q.id
        RETURNING d.id;
    ELSE
        RETURN QUERY
        WITH gone AS (
            DELETE FROM pgmb_delivery d
            WHERE d.id = ANY (delivery_ids) AND d.queue_id = q.id
            RETURNING d.id, d.message_id, d.queue_id, d.attempts
        ), history AS (
            INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
            SELECT g.message_id, g.queue_id, g.attempts, settle_reads.outcome, NULL, NULL, '', clock_timestamp()
            FROM gone g
        )
        SELECT g.id FROM gone g;
    END IF;
    GET DIAGNOSTICS done = ROW_COUNT;
    IF delivery_ids IS NULL OR done < cardinality(delivery_ids) THEN
        PERFORM pgmb.check_pull_ids(queue_name, q.id, delivery_ids);
    END IF;
END $$;

-- Reads and deletes in one step (PGMQ's pop): the messages are acknowledged as read.
CREATE OR REPLACE FUNCTION pgmb.pop(queue_name text, qty integer DEFAULT 1)
RETURNS SETOF pgmb.pull_message LANGUAGE plpgsql AS $$
DECLARE
    got pgmb.pull_message[];
BEGIN
    SELECT array_agg(r) INTO got FROM pgmb.read(queue_name, 0, qty) AS r;
    IF got IS NULL THEN
        RETURN;
    END IF;
    PERFORM pgmb.settle_reads(queue_name, ARRAY(SELECT g.delivery_id FROM unnest(got) AS g), 'ack');
    RETURN QUERY SELECT * FROM unnest(got);
END $$;

-- Acknowledges read messages: their deliveries are deleted and the history says 'ack'
-- (unless the queue keeps no history). Returns the ids deleted (PGMQ's delete).
CREATE OR REPLACE FUNCTION pgmb.delete(queue_name text, delivery_ids bigint[])
RETURNS SETOF bigint LANGUAGE sql AS $$
    SELECT pgmb.settle_reads(queue_name, delivery_ids, 'ack')
$$;

-- pgmb.delete of one message: whether it was deleted.
CREATE OR REPLACE FUNCTION pgmb.delete(queue_name text, delivery_id bigint)
RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (SELECT FROM pgmb.delete(queue_name, ARRAY[delivery_id]))
$$;

-- Like pgmb.delete, with outcome 'archived' in the history (PGMQ's archive), whether the
-- queue keeps its history or not: the message is kept, neither delivered nor failed.
CREATE OR REPLACE FUNCTION pgmb.archive(queue_name text, delivery_ids bigint[])
RETURNS SETOF bigint LANGUAGE sql AS $$
    SELECT pgmb.settle_reads(queue_name, delivery_ids, 'archived')
$$;

-- pgmb.archive of one message: whether it was archived.
CREATE OR REPLACE FUNCTION pgmb.archive(queue_name text, delivery_id bigint)
RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (SELECT FROM pgmb.archive(queue_name, ARRAY[delivery_id]))
$$;

-- Makes read messages visible again after `vt` seconds from now (PGMQ's set_vt); returns
-- them as they now are.
CREATE OR REPLACE FUNCTION pgmb.set_vt(queue_name text, delivery_ids bigint[], vt double precision)
RETURNS SETOF pgmb.pull_message LANGUAGE plpgsql AS $$
DECLARE
    q record;
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    PERFORM pgmb.check_pull_args(vt, 1, NULL);
    PERFORM pgmb.check_pull_ids(queue_name, q.id, delivery_ids);
    RETURN QUERY
    WITH r AS (
        UPDATE pgmb_delivery d SET available_at = clock_timestamp() + make_interval(secs => vt)
        WHERE d.id = ANY (delivery_ids) AND d.queue_id = q.id AND d.state = 'ready'
        RETURNING d.id, d.message_id, d.attempts, d.created_at, d.available_at
    )
    SELECT r.id, r.message_id, r.attempts, r.created_at, r.available_at, m.body, m.headers,
           m.routing_key::text
    FROM r JOIN pgmb_message m ON m.id = r.message_id
    ORDER BY r.id;
END $$;

-- pgmb.set_vt of one message.
CREATE OR REPLACE FUNCTION pgmb.set_vt(queue_name text, delivery_id bigint, vt double precision)
RETURNS SETOF pgmb.pull_message LANGUAGE sql AS $$
    SELECT * FROM pgmb.set_vt(queue_name, ARRAY[delivery_id], vt)
$$;

-- Deletes every delivery of a pull queue (PGMQ's purge_queue); returns how many.
CREATE OR REPLACE FUNCTION pgmb.purge(queue_name text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    q record;
    n bigint;
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    DELETE FROM pgmb_delivery d WHERE d.queue_id = q.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- A read that failed (a handler raised): the delivery becomes visible again after the
-- message's retry_delay or the queue's backoff, or is dead-lettered if that was read number
-- 1 + max_retries (the message's, else the queue's); the error goes to the history. Fenced
-- by the read count: a reader whose timeout ran out, and whose message someone else has read
-- since, changes nothing. Each dead letter is announced (pgmb.dead_lettered, events.sql).
-- Returns how many were recorded.
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
        -- Each dead letter announced (pgmb.dead_lettered, events.sql).
        RETURNING pgmb.dead_letter_event(message_id, queue_id, attempts, last_status, last_error)
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

-- Seconds until a message of the pull queue becomes visible (0: one is now; the first due
-- time per priority); NULL: empty, or paused (nothing is read until it is resumed).
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

-- Reads up to qty visible messages of a pull queue and hides them for vt seconds (PGMQ's
-- read); `filter` keeps those whose body contains it. The update and the dead-lettering find
-- their rows by primary key (id = ANY (ARRAY(...))), whatever the estimate, so the function
-- uses its generic plan (the settings at the end of this file): planning the statement at
-- every call cost ~8 % of a read(100) + delete (docs/benchmarks.md). The statement's rows
-- go straight to the caller (RETURN QUERY), not through an array
-- (docs/decisions/0064-a-read-returns-its-rows-from-the-statement.md).
CREATE OR REPLACE FUNCTION pgmb.read(queue_name text, vt double precision, qty integer, filter jsonb DEFAULT NULL::jsonb) RETURNS SETOF pgmb.pull_message
LANGUAGE plpgsql AS $$
DECLARE
    -- First, before any expression a planted operator could match (tables.sql).
    closed boolean := pgmb.refuse_writable_schemas();
    q record;
    t timestamptz := clock_timestamp();
    -- Visible: due at or before upto (t, then see the end of the loop).
    upto timestamptz := t;
    body_filter jsonb := filter -> 'body';
    headers_filter jsonb := filter -> 'headers';
    remaining integer := qty;
    got integer;
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    PERFORM pgmb.check_pull_args(vt, qty, filter);
    IF q.paused THEN
        RETURN;
    END IF;
    LOOP
        -- One ordered scan of the queue's part of pgmb_delivery_due, as a push claim's. A
        -- delivery read 1 + max_retries times already is dead-lettered instead, in the same
        -- statement, as pgmb.settle_failures does with push failures; the statement then
        -- sets pgmb.read_buried (for this transaction), which the caller cannot see in its
        -- rows.
        RETURN QUERY
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
            WHERE d.queue_id = q.id AND d.state = 'ready' AND d.available_at <= upto
              AND (d.expires_at IS NULL OR d.expires_at > t)  -- expired: pgmb.expire's
              AND (filter IS NULL
                   OR EXISTS (SELECT 1 FROM pgmb_message m
                              WHERE m.id = d.message_id
                                AND (body_filter IS NULL OR m.body @> body_filter)
                                AND (headers_filter IS NULL OR m.headers @> headers_filter)))
            ORDER BY d.priority, d.available_at, d.id
            LIMIT remaining
            FOR UPDATE OF d SKIP LOCKED
        ), dead AS (
            DELETE FROM pgmb_delivery d
            WHERE d.id = ANY (ARRAY(SELECT p.id FROM picked p WHERE p.exhausted))
            RETURNING d.message_id, d.queue_id, d.attempts, d.last_status,
                      format('read %s times and never deleted (max_retries %s): dead-lettered instead of read again',
                             d.attempts, (SELECT p.max_retries FROM picked p WHERE p.id = d.id)) AS error,
                      set_config('pgmb.read_buried', 'yes', true) AS buried
        ), dead_letters AS (
            INSERT INTO pgmb_dead_letter (message_id, queue_id, attempts, last_status, last_error, created_at)
            SELECT x.message_id, x.queue_id, x.attempts, x.last_status, x.error, clock_timestamp()
            FROM dead x
            ON CONFLICT (message_id, queue_id) DO UPDATE
            SET attempts = excluded.attempts, last_status = excluded.last_status,
                last_error = excluded.last_error, created_at = excluded.created_at
            -- Each dead letter announced (pgmb.dead_lettered, events.sql).
            RETURNING pgmb.dead_letter_event(message_id, queue_id, attempts, last_status, last_error)
        ), history AS (
            INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
            SELECT x.message_id, x.queue_id, x.attempts, 'dead', NULL, NULL, x.error, clock_timestamp()
            FROM dead x WHERE x.buried IS NOT NULL
        ), r AS (
            UPDATE pgmb_delivery d
            SET attempts = d.attempts + 1, available_at = t + make_interval(secs => vt)
            WHERE d.id = ANY (ARRAY(SELECT p.id FROM picked p WHERE NOT p.exhausted))
            RETURNING d.id, d.message_id, d.attempts, d.created_at, d.available_at, d.priority
        )
        SELECT r.id, r.message_id, r.attempts, r.created_at, r.available_at,
               m.body, m.headers, m.routing_key::text
        FROM r JOIN picked p ON p.id = r.id JOIN pgmb_message m ON m.id = r.message_id
        ORDER BY r.priority, p.was, r.id;
        GET DIAGNOSTICS got = ROW_COUNT;
        remaining := remaining - got;
        -- Only dead-lettered rows make room for more in the same read (rare: a full read,
        -- the common case, never looks).
        EXIT WHEN remaining <= 0 OR current_setting('pgmb.read_buried', true) IS DISTINCT FROM 'yes';
        PERFORM set_config('pgmb.read_buried', '', true);
        -- The rows just read are due at t + vt: with a timeout that rounds to nothing they
        -- are due at t, and must not be read twice.
        IF t + make_interval(secs => vt) <= t THEN
            upto := t - interval '1 microsecond';
        END IF;
    END LOOP;
END $$;

-- The entry points act for their caller (checked by pgmb.pull_queue), as pgmb.send does:
-- a consumer role needs a queue grant, no privilege on the tables (pgmb.pin_definers,
-- tables.sql).
SELECT pgmb.pin_definers(ARRAY[
    'pgmb.read(text, double precision, integer, jsonb)',
    'pgmb.read_with_poll(text, double precision, integer, double precision, integer, jsonb)',
    'pgmb.pop(text, integer)',
    'pgmb.delete(text, bigint[])', 'pgmb.delete(text, bigint)',
    'pgmb.archive(text, bigint[])', 'pgmb.archive(text, bigint)',
    'pgmb.set_vt(text, bigint[], double precision)', 'pgmb.set_vt(text, bigint, double precision)',
    'pgmb.nack(text, bigint[], integer[], text[])',
    'pgmb.purge(text)', 'pgmb.pull_next_visible(text)'
]);

-- pgmb.read plans its statement once per session (its generic plan), and with the settings
-- of the claim: a read planned against "no rows over many pages" would pick through
-- pgmb_delivery_message_queue and sort the whole queue (tests/sql/test_steady_plans.py).
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off;
