-- pgmb 0023: pull queues, consumed by clients (SQS/PGMQ style) instead of a worker.
--
-- A pull queue is a queue row without a worker (worker_id NULL). Routing fills it like any
-- other; push claims never see it (pgmb.claim, busy and next_wakeup join the worker). A
-- client reads from it: a read leaves the delivery 'ready', counts it (attempts = read_ct)
-- and moves available_at to the end of the visibility timeout, so the same index scan of
-- pgmb_delivery_due that finds new messages finds one whose timeout ran out, with no
-- dispatcher running, and pgmb.reclaim_expired (leased rows only) never sees a read
-- (docs/decisions.md). A read that would be number 2 + max_retries dead-letters the
-- delivery instead. Deleting is an ack ('ack' in the history), archiving records its own
-- outcome ('archived'), nack (a failed handler) schedules a retry with the queue's backoff.

ALTER TABLE pgmb_queue ALTER COLUMN worker_id DROP NOT NULL;

-- A pull consumer registers like a dispatcher (kind 'consumer') to be woken by publishers.
ALTER TABLE pgmb_dispatcher DROP CONSTRAINT pgmb_dispatcher_kind;
ALTER TABLE pgmb_dispatcher ADD CONSTRAINT pgmb_dispatcher_kind
    CHECK (kind = 'external' OR kind = 'in_database' OR kind = 'consumer');

-- As in 0001, with NULL for "no worker": a pull queue. An unknown worker id stays an error.
CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, max_retries integer, worker_id uuid)
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
    INSERT INTO pgmb_queue (name, binding_key, pattern, worker_id, max_retries)
    VALUES ($1, $2, '', $4, $3)  -- "create" is a keyword, so no create.name
    RETURNING id INTO new_id;
    RETURN new_id;
END $$;

-- As in 0017, and waiting pull consumers are woken too.
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

-- As in 0001, with pull queues (no worker: worker_id and worker NULL).
CREATE OR REPLACE VIEW pgmb.queues AS
SELECT q.id, q.name, q.binding_key, q.pattern, q.worker_id, w.name AS worker, q.max_retries,
       q.backoff_base, q.backoff_max, q.lease_seconds, q.paused,
       (SELECT count(*) FROM pgmb_delivery d WHERE d.queue_id = q.id) AS pending,
       (SELECT count(*) FROM pgmb_dead_letter x WHERE x.queue_id = q.id) AS dead_letters,
       q.created_at
FROM pgmb_queue q LEFT JOIN pgmb_worker w ON w.id = q.worker_id;

-- As in 0016, and an archived message is neither delivered nor failed.
CREATE OR REPLACE FUNCTION pgmb.metrics_all() RETURNS SETOF pgmb.queue_metrics
LANGUAGE sql STABLE AS $$
    SELECT q.name::text,
           r.n + coalesce(l.n, 0),
           r.due,
           extract(epoch FROM now() - greatest(r.newest, l.newest))::float8,
           extract(epoch FROM now() - r.oldest_due)::float8,
           r.n + coalesce(l.n, 0) + x.n + a.n,
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
        SELECT d.queue_id, count(*) AS n, max(d.created_at) AS newest
        FROM pgmb_delivery d WHERE d.state = 'leased' GROUP BY d.queue_id
    ) l ON l.queue_id = q.id
    LEFT JOIN (
        SELECT a.queue_id,
               count(*) FILTER (WHERE a.outcome = 'ack') AS delivered,
               count(*) FILTER (WHERE a.outcome NOT IN ('ack', 'unsent', 'archived')) AS failed
        FROM pgmb_attempt a WHERE a.created_at > now() - interval '1 hour' GROUP BY a.queue_id
    ) h ON h.queue_id = q.id
    ORDER BY q.name
$$;

-- What a read returns (PGMQ's message_record, plus pgmb's ids and routing key).
CREATE TYPE pgmb.pull_message AS (
    delivery_id bigint,   -- the handle: PGMQ's msg_id
    message_id uuid,
    read_ct integer,      -- the delivery's attempts
    enqueued_at timestamptz,
    vt timestamptz,
    body jsonb,
    headers jsonb,
    routing_key text
);

-- The pull queue named queue_name (its id, max_retries, whether it is paused), or an error.
CREATE FUNCTION pgmb.pull_queue(queue_name text, OUT id uuid, OUT max_retries integer, OUT paused boolean)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    worker text;
BEGIN
    SELECT q.id, q.max_retries, q.paused, w.name INTO id, max_retries, paused, worker
    FROM pgmb_queue q LEFT JOIN pgmb_worker w ON w.id = q.worker_id
    WHERE q.name = queue_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue % does not exist', quote_nullable(queue_name)
            USING ERRCODE = 'undefined_object',
                  HINT = 'SELECT name FROM pgmb.queues WHERE worker_id IS NULL lists the pull queues.';
    END IF;
    IF worker IS NOT NULL THEN
        RAISE EXCEPTION 'queue % is not a pull queue: worker % receives its messages', quote_literal(queue_name), quote_literal(worker)
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'Clients read only from queues without a worker: pgmb.create(name, binding_key, max_retries, NULL).';
    END IF;
    -- Every entry point comes here first: a role may consume only the queues granted to it
    -- (access control, 0021), and is refused before anything is read or written.
    IF NOT pgmb.may('consume', id) THEN
        PERFORM pgmb.require('consume', queue_name);
    END IF;
END $$;

-- The checks of a read's arguments, each with its own message.
CREATE FUNCTION pgmb.check_pull_args(vt double precision, qty integer, filter jsonb)
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

-- Deliveries among delivery_ids that exist but belong to another queue than queue_id: an
-- error, before anything is written. Ids that do not exist (settled already) are skipped.
CREATE FUNCTION pgmb.check_pull_ids(queue_name text, queue_id uuid, delivery_ids bigint[])
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    foreign_ids text;
BEGIN
    IF delivery_ids IS NULL OR array_position(delivery_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'invalid message ids: NULL is not a message id'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT string_agg(d.id::text, ', ' ORDER BY d.id) INTO foreign_ids
    FROM pgmb_delivery d WHERE d.id = ANY (delivery_ids) AND d.queue_id <> check_pull_ids.queue_id;
    IF foreign_ids IS NOT NULL THEN
        RAISE EXCEPTION 'messages % are not in queue %', foreign_ids, quote_literal(queue_name)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A message id is the delivery id a read of this queue returned.';
    END IF;
END $$;

CREATE FUNCTION pgmb.read(queue_name text, vt double precision, qty integer, filter jsonb DEFAULT NULL)
RETURNS SETOF pgmb.pull_message LANGUAGE plpgsql AS $$
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
            SELECT d.id, d.available_at AS was, d.attempts >= 1 + q.max_retries AS exhausted
            FROM pgmb_delivery d
            WHERE d.queue_id = q.id AND d.state = 'ready' AND d.available_at <= t
              AND d.id <> ALL (seen)
              AND (filter IS NULL
                   OR EXISTS (SELECT 1 FROM pgmb_message m
                              WHERE m.id = d.message_id
                                AND (body_filter IS NULL OR m.body @> body_filter)
                                AND (headers_filter IS NULL OR m.headers @> headers_filter)))
            ORDER BY d.available_at, d.id
            LIMIT remaining
            FOR UPDATE SKIP LOCKED
        ), dead AS (
            DELETE FROM pgmb_delivery d USING picked p WHERE d.id = p.id AND p.exhausted
            RETURNING d.message_id, d.queue_id, d.attempts, d.last_status,
                      format('read %s times and never deleted (max_retries %s): dead-lettered instead of read again',
                             d.attempts, q.max_retries) AS error
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
            RETURNING d.id, d.message_id, d.attempts, d.created_at, d.available_at, p.was
        )
        SELECT array_agg(ROW(r.id, r.message_id, r.attempts, r.created_at, r.available_at,
                             m.body, m.headers, m.routing_key)::pgmb.pull_message
                         ORDER BY r.was, r.id),
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

CREATE FUNCTION pgmb.read_with_poll(queue_name text, vt double precision, qty integer,
                                    max_poll_seconds double precision DEFAULT 5,
                                    poll_interval_ms integer DEFAULT 100,
                                    filter jsonb DEFAULT NULL)
RETURNS SETOF pgmb.pull_message LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz;
BEGIN
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
-- and the common case pays no second look-up.
CREATE FUNCTION pgmb.settle_reads(queue_name text, delivery_ids bigint[], outcome text)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    q record;
    done bigint[];
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    WITH gone AS (
        DELETE FROM pgmb_delivery d
        WHERE d.id = ANY (delivery_ids) AND d.queue_id = q.id
        RETURNING d.id, d.message_id, d.queue_id, d.attempts
    ), history AS (
        INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
        SELECT g.message_id, g.queue_id, g.attempts, settle_reads.outcome, NULL, NULL, '', clock_timestamp()
        FROM gone g
    )
    SELECT array_agg(g.id) INTO done FROM gone g;
    IF delivery_ids IS NULL OR coalesce(cardinality(done), 0) < cardinality(delivery_ids) THEN
        PERFORM pgmb.check_pull_ids(queue_name, q.id, delivery_ids);
    END IF;
    RETURN QUERY SELECT unnest(done);
END $$;

CREATE FUNCTION pgmb.pop(queue_name text, qty integer DEFAULT 1)
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

CREATE FUNCTION pgmb.delete(queue_name text, delivery_ids bigint[])
RETURNS SETOF bigint LANGUAGE sql AS $$
    SELECT pgmb.settle_reads(queue_name, delivery_ids, 'ack')
$$;

CREATE FUNCTION pgmb.delete(queue_name text, delivery_id bigint)
RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (SELECT FROM pgmb.delete(queue_name, ARRAY[delivery_id]))
$$;

CREATE FUNCTION pgmb.archive(queue_name text, delivery_ids bigint[])
RETURNS SETOF bigint LANGUAGE sql AS $$
    SELECT pgmb.settle_reads(queue_name, delivery_ids, 'archived')
$$;

CREATE FUNCTION pgmb.archive(queue_name text, delivery_id bigint)
RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (SELECT FROM pgmb.archive(queue_name, ARRAY[delivery_id]))
$$;

CREATE FUNCTION pgmb.set_vt(queue_name text, delivery_ids bigint[], vt double precision)
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

CREATE FUNCTION pgmb.set_vt(queue_name text, delivery_id bigint, vt double precision)
RETURNS SETOF pgmb.pull_message LANGUAGE sql AS $$
    SELECT * FROM pgmb.set_vt(queue_name, ARRAY[delivery_id], vt)
$$;

-- A read that failed (a handler raised): the delivery becomes visible again after the
-- queue's backoff, or is dead-lettered if that was read number 1 + max_retries; the error
-- goes to the history. Fenced by the read count: a reader whose timeout ran out, and whose
-- message someone else has read since, changes nothing. Returns how many were recorded.
CREATE FUNCTION pgmb.nack(queue_name text, delivery_ids bigint[], read_counts integer[], errors text[] DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql AS $$
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
        SELECT d.id, d.message_id, d.queue_id, d.attempts, u.error, d.attempts >= 1 + qu.max_retries AS exhausted,
               qu.backoff_base, qu.backoff_max
        FROM input u
        JOIN pgmb_delivery d ON d.id = u.id AND d.attempts = u.read_ct AND d.state = 'ready'
        JOIN pgmb_queue qu ON qu.id = d.queue_id AND qu.id = q.id
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
                + pgmb.retry_delay(t.attempts, t.backoff_base, t.backoff_max) * interval '1 second'
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

CREATE FUNCTION pgmb.purge(queue_name text)
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

-- Seconds until a message of the pull queue becomes visible (0: one is now); NULL: empty,
-- or paused (nothing is read until it is resumed).
CREATE FUNCTION pgmb.pull_next_visible(queue_name text)
RETURNS double precision LANGUAGE plpgsql STABLE AS $$
DECLARE
    q record;
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    IF q.paused THEN
        RETURN NULL;
    END IF;
    -- greatest() skips NULLs: an empty queue's min() must stay NULL.
    RETURN (SELECT CASE WHEN min(d.available_at) IS NOT NULL
                        THEN greatest(0, extract(epoch FROM min(d.available_at) - clock_timestamp()))::float8 END
            FROM pgmb_delivery d WHERE d.queue_id = q.id AND d.state = 'ready');
END $$;

-- The entry points act for their caller (checked by pgmb.pull_queue), as pgmb.send does
-- (0021): a consumer role needs a queue grant, no privilege on the tables.
DO $$
DECLARE
    tables name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE c.oid = 'pgmb_message'::regclass);
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'pgmb.read(text, double precision, integer, jsonb)',
        'pgmb.read_with_poll(text, double precision, integer, double precision, integer, jsonb)',
        'pgmb.pop(text, integer)',
        'pgmb.delete(text, bigint[])', 'pgmb.delete(text, bigint)',
        'pgmb.archive(text, bigint[])', 'pgmb.archive(text, bigint)',
        'pgmb.set_vt(text, bigint[], double precision)', 'pgmb.set_vt(text, bigint, double precision)',
        'pgmb.nack(text, bigint[], integer[], text[])',
        'pgmb.purge(text)', 'pgmb.pull_next_visible(text)'
    ] LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = %I, pg_temp', f, tables);
    END LOOP;
END $$;
