-- pgmb 0020: the in-database loop records and commits its outcomes in batches.
--
-- It wrote and committed every outcome on its own: an ack or a failure of one row and a
-- synchronous COMMIT (a WAL flush) per delivery, which held it to about a fifth of what
-- its HTTP transport posts alone. Now it keeps the outcomes of its requests and writes
-- them together, through pgmb.ack and pgmb.fail as before (pgmb.record_outcomes), in the
-- COMMIT before a request once pgmb.indb_commit_every of them are waiting or once the
-- oldest would otherwise wait longer than pgmb.indb_commit_ms (counting the request about
-- to be made as lasting as long as the previous one), and whenever the loop claims again,
-- waits or stops. A backend killed mid-batch loses the batch's outcomes: their leases run
-- out and the deliveries are sent again (at least once). Start marks: see the loop.

-- The loop's commit bounds, read from the settings pgmb.indb_commit_every (outcomes, 1 to
-- 10,000) and pgmb.indb_commit_ms (milliseconds, 0 to 60,000): ALTER DATABASE ... SET, or
-- ALTER ROLE, or SET in the calling session. The defaults are here and only here.
CREATE FUNCTION pgmb.indb_commit_bounds(OUT commit_every integer, OUT commit_ms float8)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    every_setting text := nullif(btrim(current_setting('pgmb.indb_commit_every', true)), '');
    ms_setting text := nullif(btrim(current_setting('pgmb.indb_commit_ms', true)), '');
BEGIN
    commit_every := 50;
    commit_ms := 50;
    -- CASE, not OR: the cast must not be tried on text the pattern refused.
    IF every_setting IS NOT NULL THEN
        IF (CASE WHEN every_setting ~ '^[0-9]{1,9}$' THEN every_setting::integer NOT BETWEEN 1 AND 10000 ELSE true END) THEN
            RAISE EXCEPTION 'invalid pgmb.indb_commit_every %: it must be a whole number of outcomes from 1 to 10000',
                            quote_literal(every_setting)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        commit_every := every_setting::integer;
    END IF;
    IF ms_setting IS NOT NULL THEN
        IF (CASE WHEN ms_setting ~ '^([0-9]{1,9}(\.[0-9]{0,6})?|\.[0-9]{1,6})$' THEN ms_setting::float8 > 60000 ELSE true END) THEN
            RAISE EXCEPTION 'invalid pgmb.indb_commit_ms %: it must be a number of milliseconds from 0 to 60000',
                            quote_literal(ms_setting)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        commit_ms := ms_setting::float8;
    END IF;
END $$;

-- As in 0003 and 0001, in PL/pgSQL: the loop calls them inside a block with an exception
-- handler (a subtransaction), where a SQL function is set up again on every call (about
-- 0.2 ms for request_headers); PL/pgSQL keeps its plan. Same bodies, same results.
CREATE OR REPLACE FUNCTION pgmb.request_headers(c pgmb.claimed, unix_time bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    built jsonb;
BEGIN
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
                   pgmb.secret_key(c.secret),
                   convert_to(c.message_id::text || '.' || unix_time || '.' || c.body, 'UTF8')), 'base64'))
           END INTO built;
    RETURN built;
END $$;

CREATE OR REPLACE FUNCTION pgmb.http_transport() RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    transport text;
BEGIN
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'http') THEN 'http'
        WHEN to_regprocedure('pgmb.post_via_plpython(text, text, jsonb, float8)') IS NOT NULL THEN 'plpython3u'
    END INTO transport;
    RETURN transport;
END $$;

-- Writes the outcomes of requests, through pgmb.ack (2xx) and pgmb.fail (the others), in
-- one call each. Should that fail, each outcome is written on its own, so that one that
-- cannot be written does not undo the others; one that cannot is marked started instead
-- (pgmb.start): the request was made, so the expiry of its lease counts as an attempt.
-- Returns how many outcomes were written.
CREATE FUNCTION pgmb.record_outcomes(delivery_ids bigint[], lease_ids uuid[], outcomes pgmb.http_outcome[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    written integer := 0;
    o pgmb.http_outcome;
BEGIN
    IF cardinality(delivery_ids) IS DISTINCT FROM cardinality(lease_ids)
       OR cardinality(delivery_ids) IS DISTINCT FROM cardinality(outcomes) THEN
        RAISE EXCEPTION 'pgmb.record_outcomes needs one lease id and one outcome per delivery id '
                        '(% delivery ids, % lease ids, % outcomes)',
                        coalesce(cardinality(delivery_ids), 0), coalesce(cardinality(lease_ids), 0),
                        coalesce(cardinality(outcomes), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(delivery_ids) = 0 THEN
        RETURN 0;
    END IF;
    BEGIN
        -- Each function only where it has rows (a call of either costs as much as a few).
        SELECT CASE WHEN a.ids IS NULL THEN 0 ELSE pgmb.ack(a.ids, a.statuses, a.durations) END
               + CASE WHEN f.ids IS NULL THEN 0
                      ELSE pgmb.fail(f.ids, f.leases, f.statuses, f.errors, f.retry_after, f.durations) END
        INTO written
        FROM (SELECT array_agg(u.id) AS ids, array_agg(u.status) AS statuses,
                     array_agg(u.duration_ms) AS durations
              FROM unnest(delivery_ids, outcomes) AS u(id, status, error, retry_after, duration_ms)
              WHERE u.status BETWEEN 200 AND 299) AS a,
             (SELECT array_agg(u.id) AS ids, array_agg(u.lease_id) AS leases,
                     array_agg(u.status) AS statuses, array_agg(u.error) AS errors,
                     array_agg(u.retry_after) AS retry_after, array_agg(u.duration_ms) AS durations
              FROM unnest(delivery_ids, lease_ids, outcomes) AS u(id, lease_id, status, error, retry_after, duration_ms)
              WHERE u.status IS NULL OR u.status NOT BETWEEN 200 AND 299) AS f;
        RETURN written;
    EXCEPTION WHEN others THEN
        RAISE WARNING 'pgmb: could not record % outcomes together (%): recording them one by one',
                      cardinality(delivery_ids), SQLERRM;
    END;
    written := 0;
    FOR i IN 1 .. cardinality(delivery_ids) LOOP
        o := outcomes[i];
        BEGIN
            IF o.status BETWEEN 200 AND 299 THEN
                written := written + pgmb.ack(ARRAY[delivery_ids[i]], ARRAY[o.status], ARRAY[o.duration_ms]);
            ELSE
                written := written + pgmb.fail(ARRAY[delivery_ids[i]], ARRAY[lease_ids[i]], ARRAY[o.status],
                                               ARRAY[o.error], ARRAY[o.retry_after], ARRAY[o.duration_ms]);
            END IF;
        EXCEPTION WHEN others THEN
            -- Not even this outcome could be written: the lease runs out and the delivery is
            -- retried, as after a crash.
            RAISE WARNING 'pgmb: could not record the outcome of delivery %: %', delivery_ids[i], SQLERRM;
            BEGIN
                PERFORM pgmb.start(ARRAY[delivery_ids[i]], ARRAY[lease_ids[i]]);
            EXCEPTION WHEN others THEN
                RAISE WARNING 'pgmb: could not mark delivery % started: %', delivery_ids[i], SQLERRM;
            END;
        END;
    END LOOP;
    RETURN written;
END $$;

-- As in 0016, with outcomes recorded and committed in batches (above). Start marks: a
-- request goes out right after a COMMIT (the first of a claim, the first after a pacing
-- wait, the first after a batch) with its mark in that COMMIT; a request made between
-- commits has no durable mark, as its outcome, committed with the batch, settles the
-- delivery anyway. If the backend dies mid-batch, those requests' leases run out unmarked
-- and are forgiven (unsent): sent again, the attempt not counted. That is bounded: from a
-- delivery's third unmarked expiry on, expiries count (0016), so a message whose request
-- kills the loop still reaches its dead letter in the end (docs/decisions.md).
CREATE OR REPLACE PROCEDURE pgmb.dispatch_loop(seconds float8 DEFAULT 55, batch integer DEFAULT 50,
                                    queue_names text[] DEFAULT NULL, as_job boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    commit_every integer;
    commit_ms float8;
    deadline timestamptz := clock_timestamp() + seconds * interval '1 second';
    next_reclaim timestamptz := clock_timestamp();
    claimed pgmb.claimed[];
    c pgmb.claimed;
    outcome pgmb.http_outcome;
    started timestamptz;
    next_post jsonb := '{}';
    wait float8;
    -- The outcomes not yet recorded, since when, and how long the last request took (the
    -- guess for the next one).
    done_ids bigint[] := '{}';
    done_leases uuid[] := '{}';
    done_outcomes pgmb.http_outcome[] := '{}';
    pending_since timestamptz;
    last_post_ms float8 := 0;
    me bigint;
    next_beat timestamptz := clock_timestamp() + interval '5 seconds';
    delivered bigint := 0;
    failed bigint := 0;
BEGIN
    -- Read first: a bad setting stops the loop before it writes anything.
    SELECT b.commit_every, b.commit_ms INTO commit_every, commit_ms FROM pgmb.indb_commit_bounds() AS b;
    IF pgmb.http_transport() IS NULL THEN
        RAISE EXCEPTION 'pgmb: no HTTP transport in this database' USING ERRCODE = 'feature_not_supported';
    END IF;
    -- Registered for the operator (pgmb.dispatchers); committed with the first claim.
    BEGIN
        me := pgmb.dispatcher_start('in_database', coalesce(host(inet_server_addr()), 'local'),
                                    pg_backend_pid(), queue_names);
    EXCEPTION WHEN others THEN
        RAISE WARNING 'pgmb: could not register the dispatcher: %', SQLERRM;
    END;
    WHILE clock_timestamp() < deadline LOOP
        EXIT WHEN as_job AND NOT pgmb.cron_job_scheduled();
        IF me IS NOT NULL AND clock_timestamp() >= next_beat THEN
            BEGIN
                PERFORM pgmb.dispatcher_beat(me, 0, delivered, failed);
            EXCEPTION WHEN others THEN
                RAISE WARNING 'pgmb: could not record a heartbeat: %', SQLERRM;
            END;
            next_beat := clock_timestamp() + interval '5 seconds';
        END IF;
        IF clock_timestamp() >= next_reclaim THEN
            BEGIN
                PERFORM pgmb.reclaim_expired();
            EXCEPTION WHEN others THEN
                RAISE WARNING 'pgmb: could not reclaim expired leases: %', SQLERRM;
            END;
            next_reclaim := clock_timestamp() + interval '5 seconds';
        END IF;
        BEGIN
            SELECT array_agg(x) INTO claimed FROM pgmb.claim(queue_names, batch) AS x;
        EXCEPTION WHEN others THEN
            -- Nothing claimed: wait as when nothing is due, then try again.
            RAISE WARNING 'pgmb: could not claim: %', SQLERRM;
            claimed := NULL;
        END;
        IF claimed IS NULL THEN
            -- Nothing waits for a sleep: the outcomes kept so far are committed first.
            PERFORM pgmb.record_outcomes(done_ids, done_leases, done_outcomes);
            done_ids := '{}';
            done_leases := '{}';
            done_outcomes := '{}';
            COMMIT;
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
                EXIT;
            END IF;
            -- Pacing: requests to one worker at least 1/rps apart (the bucket caps the rest).
            wait := 0;
            IF c.rps < 1000 AND next_post ? c.worker_id::text THEN
                wait := (next_post ->> c.worker_id::text)::float8 - extract(epoch FROM clock_timestamp());
            END IF;
            -- A COMMIT before this request: the claim's (the first of a claim), before and
            -- after a pacing wait (nothing waits for a sleep), or the batch's, once it is
            -- full or its oldest outcome would wait too long. This request's start mark
            -- goes with it.
            IF i = 1 OR wait > 0
               OR cardinality(done_ids) >= commit_every
               OR (cardinality(done_ids) > 0
                   AND extract(epoch FROM clock_timestamp() - pending_since) * 1000 + last_post_ms >= commit_ms) THEN
                PERFORM pgmb.record_outcomes(done_ids, done_leases, done_outcomes);
                done_ids := '{}';
                done_leases := '{}';
                done_outcomes := '{}';
                IF wait > 0 THEN
                    COMMIT;
                    PERFORM pg_sleep(wait);
                END IF;
                -- A failed mark does not hold the request back: its expiry would then be
                -- forgiven (up to twice), as after a crash within a batch.
                BEGIN
                    PERFORM pgmb.start(ARRAY[c.delivery_id], ARRAY[c.lease_id]);
                EXCEPTION WHEN others THEN
                    RAISE WARNING 'pgmb: could not mark delivery % started: %', c.delivery_id, SQLERRM;
                END;
                COMMIT;
            END IF;
            IF c.rps < 1000 THEN
                next_post := next_post || jsonb_build_object(c.worker_id::text,
                                                             extract(epoch FROM clock_timestamp()) + 1.0 / c.rps);
            END IF;
            started := clock_timestamp();
            BEGIN
                outcome := pgmb.post(c.endpoint, c.body,
                                     pgmb.request_headers(c, extract(epoch FROM now())::bigint), c.timeout);
            EXCEPTION WHEN others THEN
                outcome := ROW(NULL, 'could not send the request: ' || SQLERRM, NULL,
                               extract(epoch FROM clock_timestamp() - started) * 1000)::pgmb.http_outcome;
            END;
            last_post_ms := extract(epoch FROM clock_timestamp() - started) * 1000;
            IF cardinality(done_ids) = 0 THEN
                pending_since := clock_timestamp();
            END IF;
            done_ids := done_ids || c.delivery_id;
            done_leases := done_leases || c.lease_id;
            done_outcomes := done_outcomes || outcome;
            IF outcome.status BETWEEN 200 AND 299 THEN
                delivered := delivered + 1;
            ELSE
                failed := failed + 1;
            END IF;
            IF me IS NOT NULL AND clock_timestamp() >= next_beat THEN
                BEGIN
                    PERFORM pgmb.dispatcher_beat(me, cardinality(claimed) - i, delivered, failed);
                EXCEPTION WHEN others THEN
                    RAISE WARNING 'pgmb: could not record a heartbeat: %', SQLERRM;
                END;
                next_beat := clock_timestamp() + interval '5 seconds';
            END IF;
        END LOOP;
    END LOOP;
    -- The last outcomes, committed with the CALL.
    PERFORM pgmb.record_outcomes(done_ids, done_leases, done_outcomes);
    IF me IS NOT NULL THEN
        BEGIN
            PERFORM pgmb.dispatcher_stop(me, delivered, failed);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'pgmb: could not mark the dispatcher stopped: %', SQLERRM;
        END;
    END IF;
END $$;
