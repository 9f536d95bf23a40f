-- pgmb 0019: the in-database loop commits its outcomes in batches.
--
-- It committed every outcome on its own, synchronously: a WAL flush per delivery, which
-- held it to about a fifth of what its HTTP transport can post. Now the outcomes (written
-- by pgmb.ack and pgmb.fail, as before) pile up in the open transaction and are committed
-- together before a request once pgmb.indb_commit_every of them are waiting, or once the
-- oldest would otherwise wait longer than pgmb.indb_commit_ms (counting the request about
-- to be made as lasting as long as the previous one), and whenever the loop claims again,
-- waits or stops. A backend killed mid-batch loses the batch's outcomes: their leases
-- run out and the deliveries are sent again (at least once). Start marks: see the loop.

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
    IF every_setting IS NOT NULL THEN
        IF every_setting !~ '^[0-9]{1,9}$' OR every_setting::integer NOT BETWEEN 1 AND 10000 THEN
            RAISE EXCEPTION 'invalid pgmb.indb_commit_every %: it must be a whole number of outcomes from 1 to 10000',
                            quote_literal(every_setting)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        commit_every := every_setting::integer;
    END IF;
    IF ms_setting IS NOT NULL THEN
        IF ms_setting !~ '^([0-9]{1,9}(\.[0-9]{0,6})?|\.[0-9]{1,6})$' OR ms_setting::float8 > 60000 THEN
            RAISE EXCEPTION 'invalid pgmb.indb_commit_ms %: it must be a number of milliseconds from 0 to 60000',
                            quote_literal(ms_setting)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        commit_ms := ms_setting::float8;
    END IF;
END $$;

-- As in 0016, with outcomes committed in batches (above). Start marks: a request goes out
-- right after a COMMIT (the first of a claim, the first after a pacing wait, the first
-- after a batch was committed) with its mark in that COMMIT; a request made between
-- commits has no durable mark, as its outcome, committed with the batch, settles the
-- delivery anyway. If the backend dies mid-batch, those requests' leases run out unmarked
-- and are forgiven (unsent): sent again, attempt not counted. That is bounded: from a
-- delivery's third unmarked expiry on, expiries count (0016), so a message whose request
-- kills the loop still reaches its dead letter (docs/decisions.md). A request whose outcome
-- could not be written is marked, with the batch, so that its expiry counts.
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
    paced boolean;
    -- Outcomes written since the last COMMIT, when the first of them was, and how long
    -- the last request took (the guess for the next one).
    pending integer := 0;
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
            -- Nothing waits for a sleep: the outcomes still pending are committed first.
            COMMIT;
            pending := 0;
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
                IF me IS NOT NULL THEN
                    BEGIN
                        PERFORM pgmb.dispatcher_stop(me, delivered, failed);
                    EXCEPTION WHEN others THEN
                        RAISE WARNING 'pgmb: could not mark the dispatcher stopped: %', SQLERRM;
                    END;
                END IF;
                COMMIT;
                RETURN;
            END IF;
            -- Pacing: requests to one worker at least 1/rps apart (the bucket caps the rest).
            paced := false;
            IF c.rps < 1000 AND next_post ? c.worker_id::text THEN
                wait := (next_post ->> c.worker_id::text)::float8 - extract(epoch FROM clock_timestamp());
                IF wait > 0 THEN
                    COMMIT;
                    pending := 0;
                    PERFORM pg_sleep(wait);
                    paced := true;
                END IF;
            END IF;
            -- A COMMIT before this request: the claim's (the first of a claim), after a
            -- pacing wait, or the batch's once it is full or its oldest outcome would wait
            -- too long. This request's start mark goes with it.
            IF i = 1 OR paced
               OR (pending > 0
                   AND (pending >= commit_every
                        OR extract(epoch FROM clock_timestamp() - pending_since) * 1000 + last_post_ms
                           >= commit_ms)) THEN
                -- A failed mark does not hold the request back: its expiry would then be
                -- forgiven (up to twice), as after a crash within a batch.
                BEGIN
                    PERFORM pgmb.start(ARRAY[c.delivery_id], ARRAY[c.lease_id]);
                EXCEPTION WHEN others THEN
                    RAISE WARNING 'pgmb: could not mark delivery % started: %', c.delivery_id, SQLERRM;
                END;
                COMMIT;
                pending := 0;
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
            BEGIN
                IF outcome.status BETWEEN 200 AND 299 THEN
                    PERFORM pgmb.ack(ARRAY[c.delivery_id], ARRAY[outcome.status], ARRAY[outcome.duration_ms]);
                    delivered := delivered + 1;
                ELSE
                    PERFORM pgmb.fail(ARRAY[c.delivery_id], ARRAY[c.lease_id], ARRAY[outcome.status],
                                      ARRAY[outcome.error], ARRAY[outcome.retry_after], ARRAY[outcome.duration_ms]);
                    failed := failed + 1;
                END IF;
            EXCEPTION WHEN others THEN
                -- Not even the outcome could be written: the lease runs out and the delivery
                -- is retried, as after a crash; the request was made, so the expiry counts.
                RAISE WARNING 'pgmb: could not record the outcome of delivery %: %', c.delivery_id, SQLERRM;
                BEGIN
                    PERFORM pgmb.start(ARRAY[c.delivery_id], ARRAY[c.lease_id]);
                EXCEPTION WHEN others THEN
                    RAISE WARNING 'pgmb: could not mark delivery % started: %', c.delivery_id, SQLERRM;
                END;
            END;
            IF pending = 0 THEN
                pending_since := clock_timestamp();
            END IF;
            pending := pending + 1;
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
    IF me IS NOT NULL THEN
        BEGIN
            PERFORM pgmb.dispatcher_stop(me, delivered, failed);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'pgmb: could not mark the dispatcher stopped: %', SQLERRM;
        END;
    END IF;
END $$;
