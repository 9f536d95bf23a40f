-- pgmb 0029: publishing costs less; claims come back in the order they were picked.
--
-- Counted with bench/instructions.py (docs/benchmarks.md, "Publishing after 0029"):
--
-- * The routing-key CHECK (pgmb_message_routing_key_valid) goes. PostgreSQL prepares a
--   table's CHECK expressions for every statement that writes to it, and preparing this
--   one inlines pgmb.valid_routing_key: its SQL body is parsed and analysed again for each
--   INSERT, about 8 % of a pgmb.send. The routing trigger now checks the statement's keys
--   with the same function in its own statement, planned once per session; a refusal keeps
--   the constraint's SQLSTATE (23514) and name (pgmb.refuse_routing_key). An UPDATE of a
--   routing key is checked by the row trigger check_routing_key_update (pgmb/models.py).
-- * The routing trigger decides the queues once per distinct routing key of the statement,
--   not once per message: a batch of 100 messages with 3 keys computes 3 keys' tags and
--   regex matches instead of 100 (the trigger's body is pgmb/sql/queries/triggers.sql, set
--   by the migration's django-pgtrigger operations).
-- * The GIN index of the queues' binding tags (0028) no longer takes new entries into a
--   pending list (fastupdate): routing searched that unsorted list at every decision, and
--   only a vacuum empties it, which a small table like pgmb_queue may not get for long
--   (queues are written rarely, read at every publish). 1,000 queues created in a row made
--   each routed message cost 2.7x until a vacuum. The list left by earlier writes is merged
--   here.
-- * pgmb.send no longer probes pgmb_message for the id before its INSERT: the INSERT finds
--   a taken id itself (ON CONFLICT DO NOTHING), and only then is it looked up, to refuse it
--   with the same message as before. Its key check is the inlined rule, and
--   pgmb.check_routing_key runs only to word a refusal.
-- * pgmb.claim returns its rows in the order it picked them (priority, due time, id): the
--   final join could return them in any order.

-- The refusal of a routing key that the rule (pgmb.valid_routing_key) rejects, worded by
-- pgmb.check_routing_key, raised as the CHECK pgmb_message_routing_key_valid did.
CREATE FUNCTION pgmb.refuse_routing_key(routing_key text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    problem text := 'invalid routing key';
BEGIN
    BEGIN
        PERFORM pgmb.check_routing_key(routing_key);
    EXCEPTION WHEN invalid_parameter_value OR null_value_not_allowed THEN
        GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
    END;
    RAISE EXCEPTION 'message refused by pgmb_message_routing_key_valid: %', problem
        USING ERRCODE = 'check_violation', CONSTRAINT = 'pgmb_message_routing_key_valid',
              TABLE = 'pgmb_message', COLUMN = 'routing_key';
END $$;

ALTER TABLE pgmb_message DROP CONSTRAINT pgmb_message_routing_key_valid;

ALTER INDEX pgmb_queue_binding_tags SET (fastupdate = off);
SELECT gin_clean_pending_list('pgmb_queue_binding_tags'::regclass);

CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb, delay timestamp with time zone, priority integer DEFAULT 0, group_key text DEFAULT NULL::text, depends_on uuid[] DEFAULT NULL::uuid[], dedup_id text DEFAULT NULL::text, max_retries integer DEFAULT NULL::integer, retry_delay double precision DEFAULT NULL::double precision) RETURNS uuid
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
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
    IF stored IS NULL AND EXISTS (SELECT 1 FROM pgmb_message m WHERE m.id = send.id) THEN
        RAISE EXCEPTION 'message % already exists', send.id
            USING ERRCODE = 'unique_violation',
                  HINT = 'Message ids are unique; pass gen_random_uuid() for a new message.';
    END IF;
    RETURN coalesce(stored, pgmb.deduplicated(send.dedup_id));
END $$;

CREATE OR REPLACE FUNCTION pgmb.claim(queue_names text[] DEFAULT NULL::text[], max_count integer DEFAULT 100) RETURNS SETOF pgmb.claimed
    LANGUAGE plpgsql
    AS $$
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
                SELECT d.id, d.priority, d.available_at FROM pgmb_delivery d
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
                          d.message_id, qu.lease_seconds, picked.priority, picked.available_at AS due
            )
            SELECT l.id, lease, l.attempts, 1 + coalesce(m.max_retries, l.max_retries), l.queue_id,
                   l.name::text, m.id, m.routing_key::text, m.body::text, m.headers, m.created_at,
                   wk.id, wk.endpoint::text, wk.timeout, wk.secret::text, wk.rps, l.lease_seconds
            FROM leased l
            JOIN pgmb_message m ON m.id = l.message_id
            JOIN pgmb_worker wk ON wk.id = w.id
            -- In the order picked (the joins above may return rows in any order).
            ORDER BY l.priority, l.due, l.id;
            GET DIAGNOSTICS got = ROW_COUNT;
            tokens := tokens - got;
            remaining := remaining - got;
            UPDATE pgmb_worker wk SET tokens = wk.tokens - got WHERE wk.id = w.id AND got > 0;
        END LOOP;
    END LOOP;
END $$;
