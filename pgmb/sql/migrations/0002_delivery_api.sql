-- pgmb 0002: the rate limit's burst belongs to the worker; claims say how many attempts a
-- delivery has; the in-database loop survives any fault of one delivery; dead letters can
-- be purged; unrouted messages can be found.
--
-- pgmb.claimed gains a column, so the type is dropped and created again (CASCADE drops
-- pgmb.claim and pgmb.request_headers, created again below); pgmb.claim and
-- pgmb.dispatch_loop lose their `burst` argument, so the old ones are dropped. Dispatchers
-- started before this migration must be restarted after it.

ALTER TABLE pgmb_worker ADD CONSTRAINT pgmb_worker_burst_positive CHECK (burst > 0);

DROP TYPE pgmb.claimed CASCADE;

-- What a claim hands a dispatcher: the delivery, its message, and where to post it.
-- max_attempts (1 + the queue's max_retries): a failure of that attempt dead-letters.
CREATE TYPE pgmb.claimed AS (
    delivery_id bigint, lease_id uuid, attempt integer, max_attempts integer, queue_id uuid,
    queue text, message_id uuid, routing_key text, body text, headers jsonb,
    created_at timestamptz, worker_id uuid, endpoint text, timeout float8, secret text,
    rps integer, lease_seconds float8
);

-- Claim up to max_count due deliveries of the named queues (NULL: all), leasing them.
-- Each worker's rps is a token bucket shared by every dispatcher: it refills at rps per
-- second up to rps * burst tokens (the worker's own burst), and a claim takes at most
-- what is in it.
CREATE FUNCTION pgmb.claim(queue_names text[] DEFAULT NULL, max_count integer DEFAULT 100)
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
BEGIN
    FOR w IN
        SELECT wk.id, array_agg(qu.id ORDER BY random()) AS queue_ids
        FROM pgmb_queue qu JOIN pgmb_worker wk ON wk.id = qu.worker_id
        WHERE NOT qu.paused AND wk.active
          AND (queue_names IS NULL OR qu.name = ANY (queue_names))
          AND EXISTS (SELECT 1 FROM pgmb_delivery d
                      WHERE d.queue_id = qu.id AND d.state = 'ready' AND d.available_at <= t)
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
        RETURNING floor(wk.tokens)::integer INTO tokens;
        tokens := least(tokens, remaining);
        CONTINUE WHEN tokens <= 0;
        -- Queue by queue, so each claim is an ordered scan of one queue's partial index.
        FOREACH q IN ARRAY w.queue_ids LOOP
            EXIT WHEN tokens <= 0;
            RETURN QUERY
            WITH picked AS (
                SELECT d.id FROM pgmb_delivery d
                WHERE d.queue_id = q AND d.state = 'ready' AND d.available_at <= t
                ORDER BY d.available_at, d.id
                LIMIT tokens
                FOR UPDATE SKIP LOCKED
            ), leased AS (
                UPDATE pgmb_delivery d
                SET state = 'leased', attempts = d.attempts + 1, lease_id = lease,
                    available_at = t + qu.lease_seconds * interval '1 second'
                FROM picked, pgmb_queue qu
                WHERE d.id = picked.id AND qu.id = d.queue_id
                RETURNING d.id, d.attempts, 1 + qu.max_retries AS max_attempts, d.queue_id, qu.name,
                          d.message_id, qu.lease_seconds
            )
            SELECT l.id, lease, l.attempts, l.max_attempts, l.queue_id, l.name::text, m.id,
                   m.routing_key::text, m.body::text, m.headers, m.created_at, wk.id,
                   wk.endpoint::text, wk.timeout, wk.secret::text, wk.rps, l.lease_seconds
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

-- The headers of one POST, as pgmb/dispatch/request.py builds them: the message's own
-- headers (printable ASCII values of valid names, none reserved), pgmb's, and a Standard
-- Webhooks signature when the worker has a secret.
CREATE FUNCTION pgmb.request_headers(c pgmb.claimed, unix_time bigint) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce((
               SELECT jsonb_object_agg(e.key, v.value)
               FROM jsonb_each(coalesce(c.headers, '{}')) AS e
               CROSS JOIN LATERAL (SELECT CASE WHEN jsonb_typeof(e.value) = 'string'
                                               THEN e.value #>> '{}' ELSE e.value::text END AS value) AS v
               WHERE lower(e.key) NOT IN ('host', 'content-type', 'content-length', 'connection',
                                          'transfer-encoding', 'expect', 'upgrade', 'te', 'trailer',
                                          'keep-alive', 'proxy-connection')
                 AND lower(e.key) NOT LIKE 'pgmb-%' AND lower(e.key) NOT LIKE 'webhook-%'
                 AND e.key ~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]{1,128}$'
                 AND v.value ~ '^[\x20-\x7e]*$'), '{}')
        || jsonb_build_object(
               'Content-Type', 'application/json',
               'pgmb-message-id', c.message_id::text,
               'pgmb-routing-key', c.routing_key,
               'pgmb-queue', c.queue,
               'pgmb-attempt', c.attempt::text)
        || CASE WHEN coalesce(c.secret, '') = '' THEN '{}'::jsonb ELSE jsonb_build_object(
               'webhook-id', c.message_id::text,
               'webhook-timestamp', unix_time::text,
               'webhook-signature', 'v1,' || encode(pgmb.hmac_sha256(
                   CASE WHEN c.secret LIKE 'whsec\_%' THEN decode(substr(c.secret, 7), 'base64')
                        ELSE convert_to(c.secret, 'UTF8') END,
                   convert_to(c.message_id::text || '.' || unix_time || '.' || c.body, 'UTF8')), 'base64'))
           END
$$;

DROP PROCEDURE pgmb.dispatch_loop(float8, integer, text[], float8, boolean);

-- Dispatch for `seconds`: claim a batch (COMMIT), POST each delivery and record its outcome
-- (COMMIT after each), so no row lock is held across a request and one failure never undoes
-- another's ack. Run by pg_cron; also CALLable by hand. Must be CALLed outside a transaction.
-- As a pg_cron job (as_job), it also stops as soon as its job is unscheduled.
--
-- Whatever goes wrong with one delivery (a secret that cannot be decoded, a transport
-- error, anything raised while building or sending its request) becomes that delivery's
-- failed attempt; the loop goes on with the others.
CREATE PROCEDURE pgmb.dispatch_loop(seconds float8 DEFAULT 55, batch integer DEFAULT 50,
                                    queue_names text[] DEFAULT NULL, as_job boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + seconds * interval '1 second';
    next_reclaim timestamptz := clock_timestamp();
    claimed pgmb.claimed[];
    c pgmb.claimed;
    outcome pgmb.http_outcome;
    started timestamptz;
    next_post jsonb := '{}';
    wait float8;
BEGIN
    IF pgmb.http_transport() IS NULL THEN
        RAISE EXCEPTION 'pgmb: no HTTP transport in this database' USING ERRCODE = 'feature_not_supported';
    END IF;
    WHILE clock_timestamp() < deadline LOOP
        EXIT WHEN as_job AND NOT pgmb.cron_job_scheduled();
        IF clock_timestamp() >= next_reclaim THEN
            PERFORM pgmb.reclaim_expired();
            next_reclaim := clock_timestamp() + interval '5 seconds';
        END IF;
        SELECT array_agg(x) INTO claimed FROM pgmb.claim(queue_names, batch) AS x;
        COMMIT;
        IF claimed IS NULL THEN
            wait := least(coalesce(pgmb.next_wakeup(queue_names), 1), 1,
                          extract(epoch FROM deadline - clock_timestamp()));
            COMMIT;
            PERFORM pg_sleep(greatest(wait, 0.005));
            CONTINUE;
        END IF;
        FOR i IN 1 .. cardinality(claimed) LOOP
            c := claimed[i];
            IF clock_timestamp() >= deadline THEN
                -- Out of time: hand back what was not posted, unattempted.
                PERFORM pgmb.release(ARRAY(SELECT x.delivery_id FROM unnest(claimed[i:]) AS x),
                                     ARRAY(SELECT x.lease_id FROM unnest(claimed[i:]) AS x));
                COMMIT;
                RETURN;
            END IF;
            -- Pacing: requests to one worker at least 1/rps apart (the bucket caps the rest).
            IF c.rps < 1000 AND next_post ? c.worker_id::text THEN
                wait := (next_post ->> c.worker_id::text)::float8 - extract(epoch FROM clock_timestamp());
                IF wait > 0 THEN PERFORM pg_sleep(wait); END IF;
            END IF;
            next_post := next_post || jsonb_build_object(c.worker_id::text,
                                                         extract(epoch FROM clock_timestamp()) + 1.0 / c.rps);
            started := clock_timestamp();
            BEGIN
                outcome := pgmb.post(c.endpoint, c.body,
                                     pgmb.request_headers(c, extract(epoch FROM now())::bigint), c.timeout);
            EXCEPTION WHEN others THEN
                outcome := ROW(NULL, 'could not send the request: ' || SQLERRM, NULL,
                               extract(epoch FROM clock_timestamp() - started) * 1000)::pgmb.http_outcome;
            END;
            BEGIN
                IF outcome.status BETWEEN 200 AND 299 THEN
                    PERFORM pgmb.ack(ARRAY[c.delivery_id], ARRAY[outcome.status], ARRAY[outcome.duration_ms]);
                ELSE
                    PERFORM pgmb.fail(ARRAY[c.delivery_id], ARRAY[c.lease_id], ARRAY[outcome.status],
                                      ARRAY[outcome.error], ARRAY[outcome.retry_after], ARRAY[outcome.duration_ms]);
                END IF;
            EXCEPTION WHEN others THEN
                -- Not even the outcome could be written: the lease runs out and the delivery
                -- is retried, as after a crash.
                RAISE WARNING 'pgmb: could not record the outcome of delivery %: %', c.delivery_id, SQLERRM;
            END;
            COMMIT;
        END LOOP;
    END LOOP;
END $$;

-- Dead letters an operator gives up on: deleted (their attempts stay in the history).
CREATE FUNCTION pgmb.purge_dead_letters(dead_letter_ids bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM pgmb_dead_letter x WHERE x.id = ANY (dead_letter_ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

CREATE FUNCTION pgmb.purge_dead_letters(queue_name text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM pgmb_dead_letter x USING pgmb_queue q
    WHERE q.id = x.queue_id AND q.name = queue_name;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- The messages among these that no queue got: no binding matched their routing key when
-- they were published (routing happens once, at publish time).
CREATE FUNCTION pgmb.unrouted(message_ids uuid[]) RETURNS SETOF uuid
LANGUAGE sql STABLE AS $$
    SELECT u.id FROM unnest(message_ids) WITH ORDINALITY AS u(id, n)
    WHERE EXISTS (SELECT 1 FROM pgmb_message m WHERE m.id = u.id)
      AND NOT EXISTS (SELECT 1 FROM pgmb_delivery d WHERE d.message_id = u.id)
      AND NOT EXISTS (SELECT 1 FROM pgmb_dead_letter x WHERE x.message_id = u.id)
      AND NOT EXISTS (SELECT 1 FROM pgmb_attempt a WHERE a.message_id = u.id)
    ORDER BY u.n
$$;
