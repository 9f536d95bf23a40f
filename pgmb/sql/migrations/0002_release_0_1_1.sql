-- Migration 0002_release_0_1_1 (pgmb 0.1.1): what changed in pgmb/sql/schema/ since 0.1.0,
-- written by hand, by concern. Every object here is also in pgmb/sql/schema/, which stays
-- the source to read; tests/migrations proves both build the same catalog. 0.1.0's
-- dispatchers keep running while this applies: a function they call keeps its arguments
-- and result (a changed one gets a new name beside it; CONTRIBUTING.md, Migrations).

-- ==== Delivery: routing keys, leases of the in-database loop ====

-- Issue 26, items 1 and 2: a routing key is carried percent-encoded in pgmb-routing-key
-- (docs/decisions/0051); a failure of pgmb's own never counts toward a circuit breaker;
-- the in-database loop posts a row only if its request can end within its lease
-- (docs/decisions/0052). Signatures unchanged; two new functions, closed to PUBLIC.

CREATE OR REPLACE FUNCTION pgmb.own_failure(status integer, error text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT status IS NULL AND starts_with(coalesce(error, ''), 'pgmb''s own failure: ')
$$;

CREATE OR REPLACE FUNCTION pgmb.breaker_settle(delivery_ids bigint[], lease_ids uuid[], statuses integer[],
                                    errors text[], acked boolean) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    -- The outcomes of workers with a breaker, by worker (in id order), then as given.
    o_workers uuid[];
    o_leases uuid[];
    o_statuses integer[];
    o_errors text[];
    w pgmb_worker;
    was text;
    t timestamptz;
    failed boolean;
    weight float8;
    requests float8;
    failures float8;
    moved integer := 0;
BEGIN
    -- No worker has a breaker: nothing read, nothing written (the index is empty).
    IF NOT EXISTS (SELECT 1 FROM pgmb_worker wk WHERE wk.breaker_failures > 0 OR wk.breaker_rate IS NOT NULL) THEN
        RETURN 0;
    END IF;
    SELECT array_agg(l.worker_id ORDER BY l.worker_id, l.n), array_agg(l.lease_id ORDER BY l.worker_id, l.n),
           array_agg(l.status ORDER BY l.worker_id, l.n), array_agg(l.error ORDER BY l.worker_id, l.n)
    INTO o_workers, o_leases, o_statuses, o_errors
    FROM (SELECT u.n, q.worker_id, d.lease_id, u.status, u.error
          FROM unnest(delivery_ids, lease_ids, statuses, errors) WITH ORDINALITY AS u(id, lease_id, status, error, n)
          JOIN pgmb_delivery d ON d.id = u.id AND d.state = 'leased' AND (acked OR d.lease_id = u.lease_id)
          JOIN pgmb_queue q ON q.id = d.queue_id
          JOIN pgmb_worker wk ON wk.id = q.worker_id
          WHERE wk.breaker_failures > 0 OR wk.breaker_rate IS NOT NULL
          ORDER BY d.id
          FOR UPDATE OF d) AS l;
    FOR i IN 1 .. coalesce(cardinality(o_workers), 0) LOOP
        IF i = 1 OR o_workers[i] <> o_workers[i - 1] THEN
            SELECT * INTO w FROM pgmb_worker wk WHERE wk.id = o_workers[i] FOR UPDATE;
            was := w.breaker_state;
        END IF;
        t := clock_timestamp();
        failed := NOT acked AND pgmb.breaker_counts(o_statuses[i]);
        -- Open: what was out when it opened settles without a say (the probe decides).
        IF NOT acked AND pgmb.own_failure(o_statuses[i], o_errors[i]) THEN
            -- pgmb's own failure: not the endpoint's, not a request. A probe's: the next
            -- claim sends another.
            IF w.breaker_state = 'half_open' AND o_leases[i] = w.breaker_probe THEN
                w.breaker_probe := NULL;
                w.breaker_until := t;
            END IF;
        ELSIF w.breaker_state = 'half_open' THEN
            -- Only the probe decides; requests that were out before it opened do not.
            IF o_leases[i] = w.breaker_probe THEN
                w.breaker_trips := CASE WHEN failed THEN w.breaker_trips + 1 ELSE 0 END;
                IF failed THEN
                    w.breaker_state := 'open';
                    w.breaker_until := t + pgmb.breaker_cooldown(w.breaker_cooldown, w.breaker_cooldown_max,
                                                                  w.breaker_trips) * interval '1 second';
                    w.breaker_reason := format('the probe failed (%s); next probe in %s s',
                                               pgmb.breaker_describe(o_statuses[i], o_errors[i]),
                                               round(extract(epoch FROM w.breaker_until - t)::numeric, 1));
                ELSE
                    w.breaker_state := 'closed';
                    w.breaker_until := NULL;
                    w.breaker_reason := format('the probe succeeded (%s)',
                                               pgmb.breaker_describe(o_statuses[i], o_errors[i]));
                END IF;
                w.breaker_since := t;
                w.breaker_probe := NULL;
                w.breaker_streak := CASE WHEN failed THEN w.breaker_streak + 1 ELSE 0 END;
                w.breaker_window_at := NULL;
                w.breaker_requests := 0;
                w.breaker_failed := 0;
                w.breaker_prev_requests := 0;
                w.breaker_prev_failed := 0;
            END IF;
        ELSIF w.breaker_state = 'closed' THEN
            -- Counted in two buckets of the window, the previous one weighed by how much of
            -- it the window still covers.
            IF w.breaker_window_at IS NULL
               OR t >= w.breaker_window_at + 2 * w.breaker_window * interval '1 second' THEN
                w.breaker_window_at := t;
                w.breaker_prev_requests := 0;
                w.breaker_prev_failed := 0;
                w.breaker_requests := 0;
                w.breaker_failed := 0;
            ELSIF t >= w.breaker_window_at + w.breaker_window * interval '1 second' THEN
                w.breaker_window_at := w.breaker_window_at + w.breaker_window * interval '1 second';
                w.breaker_prev_requests := w.breaker_requests;
                w.breaker_prev_failed := w.breaker_failed;
                w.breaker_requests := 0;
                w.breaker_failed := 0;
            END IF;
            w.breaker_requests := w.breaker_requests + 1;
            w.breaker_failed := w.breaker_failed + failed::integer;
            w.breaker_streak := CASE WHEN failed THEN w.breaker_streak + 1 ELSE 0 END;
            weight := greatest(0, 1 - extract(epoch FROM t - w.breaker_window_at) / w.breaker_window);
            requests := w.breaker_requests + w.breaker_prev_requests * weight;
            failures := w.breaker_failed + w.breaker_prev_failed * weight;
            IF failed AND w.breaker_failures > 0 AND w.breaker_streak >= w.breaker_failures THEN
                w.breaker_state := 'open';
                w.breaker_reason := format('%s failures in a row (last: %s)', w.breaker_streak,
                                           pgmb.breaker_describe(o_statuses[i], o_errors[i]));
            ELSIF failed AND w.breaker_rate IS NOT NULL AND requests >= w.breaker_min_requests
                  AND failures >= w.breaker_rate * requests THEN
                w.breaker_state := 'open';
                w.breaker_reason := format('%s%% of the requests of the last %s s failed (%s of %s; last: %s)',
                                           round((100 * failures / requests)::numeric), w.breaker_window,
                                           round(failures::numeric), round(requests::numeric),
                                           pgmb.breaker_describe(o_statuses[i], o_errors[i]));
            END IF;
            IF w.breaker_state = 'open' THEN
                w.breaker_trips := w.breaker_trips + 1;
                w.breaker_since := t;
                w.breaker_until := t + pgmb.breaker_cooldown(w.breaker_cooldown, w.breaker_cooldown_max,
                                                              w.breaker_trips) * interval '1 second';
            END IF;
        END IF;
        IF i = cardinality(o_workers) OR o_workers[i + 1] <> o_workers[i] THEN
            UPDATE pgmb_worker wk
            SET breaker_state = w.breaker_state, breaker_since = w.breaker_since,
                breaker_until = w.breaker_until, breaker_reason = w.breaker_reason,
                breaker_streak = w.breaker_streak, breaker_trips = w.breaker_trips,
                breaker_probe = w.breaker_probe, breaker_window_at = w.breaker_window_at,
                breaker_requests = w.breaker_requests, breaker_failed = w.breaker_failed,
                breaker_prev_requests = w.breaker_prev_requests, breaker_prev_failed = w.breaker_prev_failed
            WHERE wk.id = w.id;
            IF w.breaker_state <> was THEN
                PERFORM pgmb.breaker_announce(w.name, w.breaker_state, w.breaker_reason);
                moved := moved + 1;
            END IF;
        END IF;
    END LOOP;
    RETURN moved;
END $$;

CREATE OR REPLACE FUNCTION pgmb.routing_key_header(routing_key text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN routing_key ~ '^[\x21-\x24\x26-\x7e]*$' THEN routing_key
                ELSE (SELECT string_agg(CASE WHEN ch ~ '^[\x21-\x24\x26-\x7e]$' THEN ch
                                             ELSE upper(regexp_replace(encode(convert_to(ch, 'UTF8'), 'hex'),
                                                                       '(..)', '%\1', 'g')) END,
                                        '' ORDER BY n)
                      FROM regexp_split_to_table(routing_key, '') WITH ORDINALITY AS t(ch, n)) END
$$;

CREATE OR REPLACE FUNCTION pgmb.run_headers(requests pgmb.claimed[], unix_time bigint)
RETURNS jsonb[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    built jsonb[];
BEGIN
    SELECT array_agg(
               coalesce((
                   SELECT jsonb_object_agg(e.key, v.value)
                   FROM jsonb_each(coalesce(c.headers, '{}')) AS e
                   CROSS JOIN LATERAL (SELECT CASE WHEN jsonb_typeof(e.value) = 'string'
                                                   THEN e.value #>> '{}' ELSE e.value::text END AS value) AS v
                   WHERE NOT pgmb.reserved_header(e.key)
                     AND e.key ~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]{1,128}$'
                     AND v.value ~ '^[\x20-\x7e]*$'), '{}')
            || jsonb_build_object(
                   'Content-Type', 'application/json',
                   'pgmb-message-id', c.message_id::text,
                   'pgmb-routing-key', pgmb.routing_key_header(c.routing_key),
                   'pgmb-queue', c.queue,
                   'pgmb-attempt', c.attempt::text)
            -- One "v1,<signature>" per secret, space-separated, in the order given (current
            -- first): a receiver holding any of them verifies (rotation).
            || CASE WHEN coalesce(cardinality(c.secrets), 0) = 0 THEN '{}'::jsonb ELSE jsonb_build_object(
                   'webhook-id', c.message_id::text,
                   'webhook-timestamp', unix_time::text,
                   'webhook-signature', (
                       SELECT string_agg('v1,' || encode(pgmb.hmac_sha256(
                                  pgmb.secret_key(s.secret),
                                  convert_to(c.message_id::text || '.' || unix_time || '.' || c.body, 'UTF8')), 'base64'),
                              ' ' ORDER BY s.n)
                       FROM unnest(c.secrets) WITH ORDINALITY AS s(secret, n)))
               END
            ORDER BY c.ordinality)
    INTO built
    FROM unnest(requests) WITH ORDINALITY AS c;
    RETURN built;
END $$;

CREATE OR REPLACE PROCEDURE pgmb.dispatch_loop(seconds float8 DEFAULT 55, batch integer DEFAULT 50,
                                    queue_names text[] DEFAULT NULL, as_job boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    commit_every integer;
    commit_ms float8;
    deadline timestamptz := clock_timestamp() + seconds * interval '1 second';
    next_reclaim timestamptz := clock_timestamp();
    claimed pgmb.claimed[];
    -- When the claim began: its leases run out lease_seconds after (or a little later).
    claimed_at timestamptz;
    c pgmb.claimed;
    outcome pgmb.http_outcome;
    built_headers jsonb;
    -- pgmb.start's answer for the row about to be posted (NULL: not asked, or it failed).
    marked integer;
    -- Seconds since the claim began.
    waited float8;
    transport text;
    runs boolean;
    started timestamptz;
    next_post jsonb := '{}';
    wait float8;
    i integer;
    -- The run starting at row i: rows i .. run_end, their requests, their outcomes.
    run_end integer;
    run_max integer;
    run_urls text[];
    run_bodies text[];
    run_headers jsonb[];
    run_timeouts float8[];
    run_ids bigint[];
    run_leases uuid[];
    -- The last moment (seconds since the epoch) a request of the run may begin and still
    -- end within its lease.
    run_lease_end float8;
    run_ok integer;
    paced boolean;
    run_outcomes pgmb.http_outcome[];
    run_first float8;
    run_last_ms float8;
    posted integer;
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
        PERFORM pgmb.no_transport();
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
            claimed_at := clock_timestamp();
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
        -- Once per claim: an http extension created or dropped meanwhile is seen at the next.
        -- Runs need pgmb.post_run_via_plpython, which a database given PL/Python by hand may
        -- lack: then one request at a time.
        transport := pgmb.http_transport();
        runs := transport = 'plpython3u'
                AND to_regprocedure('pgmb.post_run_via_plpython(text[], text[], jsonb[], float8[], integer, '
                                    'float8, float8, float8, float8)') IS NOT NULL;
        -- Whether a run must look for paced rows that end it (most claims have none).
        SELECT coalesce(bool_or(x.rps < 1000), false) INTO paced FROM unnest(claimed) AS x;
        i := 1;
        WHILE i <= cardinality(claimed) LOOP
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
            marked := NULL;
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
                    marked := pgmb.start(ARRAY[c.delivery_id], ARRAY[c.lease_id]);
                EXCEPTION WHEN others THEN
                    RAISE WARNING 'pgmb: could not mark delivery % started: %', c.delivery_id, SQLERRM;
                END;
                COMMIT;
            END IF;
            -- A request ends within its lease (docs/decisions/0040-a-request-ends-within-its-lease.md):
            -- posted only if it can end before its lease runs out, reckoned from before the
            -- claim, as pgmb_dispatch does (where a lease stored before that rule is not
            -- longer than the timeout, a request that waited under a quarter of it goes). A
            -- later one is handed back unattempted, with the outcomes kept so far, so that no
            -- other dispatcher posts it while this one does. A start mark refused (0: the
            -- lease is no longer this claim's, reclaimed after it ran out) is not posted either.
            -- In seconds, not intervals: a timeout or lease stored before the rules may be
            -- past what an interval holds.
            waited := extract(epoch FROM clock_timestamp() - claimed_at);
            IF marked = 0
               OR (waited + c.timeout >= c.lease_seconds
                   AND (c.lease_seconds > c.timeout OR waited > c.lease_seconds / 4)) THEN
                PERFORM pgmb.record_outcomes(done_ids, done_leases, done_outcomes);
                done_ids := '{}';
                done_leases := '{}';
                done_outcomes := '{}';
                IF marked IS DISTINCT FROM 0 THEN
                    PERFORM pgmb.release(ARRAY[c.delivery_id], ARRAY[c.lease_id]);
                END IF;
                COMMIT;
                i := i + 1;
                CONTINUE;
            END IF;
            run_end := NULL;
            IF runs AND c.rps >= 1000 THEN
                -- The run: this row and the unpaced rows after it, as many as the batch has
                -- room for (pgmb.post_run_via_plpython stops earlier at the batch's other
                -- bounds).
                run_end := i - 1 + least(cardinality(claimed) - i + 1, commit_every - cardinality(done_ids));
                IF paced THEN
                    SELECT coalesce(min(k) - 1, run_end) INTO run_end
                    FROM generate_series(i + 1, run_end) AS k
                    WHERE (claimed[k]).rps < 1000;
                END IF;
                -- The headers of the whole run in one statement. Should one row's fail (a
                -- secret stored before the rules refused it, say), the rows before it make
                -- the run, and it goes the one-request way, which records its fault.
                BEGIN
                    run_headers := pgmb.run_headers(claimed[i:run_end], extract(epoch FROM now())::bigint);
                EXCEPTION WHEN others THEN
                    run_max := run_end;
                    run_end := i - 1;
                    WHILE run_end < run_max LOOP
                        BEGIN
                            PERFORM pgmb.request_headers(claimed[run_end + 1], extract(epoch FROM now())::bigint);
                        EXCEPTION WHEN others THEN
                            EXIT;
                        END;
                        run_end := run_end + 1;
                    END LOOP;
                    IF run_end >= i THEN
                        run_headers := pgmb.run_headers(claimed[i:run_end], extract(epoch FROM now())::bigint);
                    ELSE
                        run_end := NULL;
                    END IF;
                END;
                IF run_end IS NOT NULL THEN
                    SELECT array_agg(x.endpoint ORDER BY x.ordinality), array_agg(x.body ORDER BY x.ordinality),
                           array_agg(x.timeout ORDER BY x.ordinality), array_agg(x.delivery_id ORDER BY x.ordinality),
                           array_agg(x.lease_id ORDER BY x.ordinality),
                           min(extract(epoch FROM claimed_at) + x.lease_seconds - x.timeout)
                    INTO run_urls, run_bodies, run_timeouts, run_ids, run_leases, run_lease_end
                    FROM unnest(claimed[i:run_end]) WITH ORDINALITY AS x;
                END IF;
            END IF;
            IF c.rps < 1000 THEN
                next_post := next_post || jsonb_build_object(c.worker_id::text,
                                                             extract(epoch FROM clock_timestamp()) + 1.0 / c.rps);
            END IF;
            started := clock_timestamp();
            IF run_end IS NOT NULL THEN
                BEGIN
                    SELECT array_agg(ROW(r.status, r.error, r.retry_after, r.duration_ms)::pgmb.http_outcome ORDER BY r.n),
                           min(r.finished), (array_agg(r.duration_ms ORDER BY r.n DESC))[1],
                           count(*), count(*) FILTER (WHERE r.status BETWEEN 200 AND 299)
                    INTO run_outcomes, run_first, run_last_ms, posted, run_ok
                    FROM pgmb.post_run_via_plpython(
                             run_urls, run_bodies, run_headers, run_timeouts,
                             commit_every - cardinality(done_ids), commit_ms,
                             CASE WHEN cardinality(done_ids) > 0
                                  THEN extract(epoch FROM clock_timestamp() - pending_since) * 1000 END,
                             last_post_ms,
                             -- No window begins past the loop's end, nor once a request of the
                             -- run could outlast its lease (the rest come back here, one by one).
                             least(extract(epoch FROM deadline)::float8, run_lease_end))
                         WITH ORDINALITY AS r(status, error, retry_after, duration_ms, finished, n);
                EXCEPTION WHEN others THEN
                    -- Not a request's fault (those are outcomes): the call's. Recorded against
                    -- the run's first row; the rest go on in the next run.
                    run_outcomes := ARRAY[ROW(NULL, 'pgmb''s own failure: could not send the request: ' || SQLERRM, NULL,
                                              extract(epoch FROM clock_timestamp() - started) * 1000)::pgmb.http_outcome];
                    run_first := extract(epoch FROM clock_timestamp());
                    run_last_ms := extract(epoch FROM clock_timestamp() - started) * 1000;
                    posted := 1;
                    run_ok := 0;
                END;
                last_post_ms := run_last_ms;
                IF cardinality(done_ids) = 0 THEN
                    pending_since := to_timestamp(run_first);
                END IF;
                done_ids := done_ids || run_ids[1:posted];
                done_leases := done_leases || run_leases[1:posted];
                done_outcomes := done_outcomes || run_outcomes;
                delivered := delivered + run_ok;
                failed := failed + posted - run_ok;
                i := i + posted;
            ELSE
                -- A request that cannot be built, or a call that fails rather than give an
                -- outcome, is pgmb's own failure (breakers.sql, pgmb.own_failure): the
                -- delivery's attempt, never the endpoint's.
                built_headers := NULL;
                BEGIN
                    built_headers := pgmb.request_headers(c, extract(epoch FROM now())::bigint);
                    -- Two statements, not one CASE: an expression naming pgmb.post_via_plpython
                    -- cannot even be planned where PL/Python is missing.
                    IF transport = 'plpython3u' THEN
                        outcome := pgmb.post_via_plpython(c.endpoint, c.body, built_headers, c.timeout);
                    ELSE
                        outcome := pgmb.post(c.endpoint, c.body, built_headers, c.timeout);
                    END IF;
                EXCEPTION WHEN others THEN
                    outcome := ROW(NULL, 'pgmb''s own failure: '
                                         || CASE WHEN built_headers IS NULL THEN 'could not build the request: '
                                                 ELSE 'could not send the request: ' END || SQLERRM, NULL,
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
                i := i + 1;
            END IF;
            IF me IS NOT NULL AND clock_timestamp() >= next_beat THEN
                BEGIN
                    PERFORM pgmb.dispatcher_beat(me, cardinality(claimed) - i + 1, delivered, failed);
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

REVOKE EXECUTE ON FUNCTION pgmb.own_failure(integer, text), pgmb.routing_key_header(text) FROM PUBLIC;


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

-- Workers' endpoints and secrets (docs/security.md): the endpoint rule of every writer (a
-- host, an IPv6 address in brackets, a port from 1 to 65535), the endpoint masked in the
-- trigger's error; a new secret's 16 bytes and at most 5 retiring secrets signing
-- (docs/decisions/0058-secret-length-and-retiring-bound.md). Stored rows are not checked
-- again: an unchanged endpoint or secret stays accepted, a short stored secret still signs.

-- What keeps a secret from being set as a worker's secret now (the worker trigger asks for a
-- changed one), or NULL: the secret rule (pgmb.secret_problem), then at least 16 bytes of
-- key (pgmb.worker_secrets.MIN_SECRET_BYTES, the same sentences; tests/rules). A shorter
-- secret stored before the rule still signs (pgmb.secret_key takes it) while it stays.
CREATE OR REPLACE FUNCTION pgmb.new_secret_problem(secret text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(pgmb.secret_problem(secret),
                    CASE WHEN secret <> '' AND octet_length(pgmb.secret_key(secret)) < 16
                         THEN 'a secret must hold at least 16 bytes (the base64 after ''whsec_'' decoded, or the text''s UTF-8 bytes)'
                    END)
$$;

-- The most retiring secrets that sign a worker's requests beside its current one
-- (pgmb.worker_secrets.MAX_RETIRING_SECRETS): each is one more signature a request, one
-- more HMAC on every path.
CREATE OR REPLACE FUNCTION pgmb.max_retiring_secrets() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 5
$$;

-- The secrets that sign a worker's requests at time `at`, the one rule for every signing
-- path (the claim hands them to the external dispatcher and the in-database transports;
-- the admin's test request asks here): its secret `current` unless empty, then its retiring
-- secrets that have not expired, the most recently retired first, at most
-- pgmb.max_retiring_secrets() of them (rows written past the bound, by a direct INSERT
-- say, sign nothing). An empty array: the requests are not signed.
CREATE OR REPLACE FUNCTION pgmb.signing_secrets(current text, worker_id uuid, at timestamptz)
RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT array_remove(ARRAY[current], '') || ARRAY(
        SELECT s.secret::text FROM pgmb_worker_secret s
        WHERE s.worker_id = signing_secrets.worker_id AND s.expires_at > at
        ORDER BY s.retired_at DESC, s.id DESC
        LIMIT pgmb.max_retiring_secrets())
$$;

-- The worker trigger's part of rotation (models.Worker's worker_retire_secret, on an
-- UPDATE that changes the secret): the old secret, unless empty or broken (one stored
-- before the rule, which could not sign), retires for pgmb.secret_overlap(); a secret
-- that becomes current again stops retiring; the worker's expired ones are removed, and
-- so are the oldest beyond pgmb.max_retiring_secrets() (300 rotations leave 5 retiring
-- secrets, not 300 signatures a request).
CREATE OR REPLACE FUNCTION pgmb.retire_secret(worker_id uuid, old_secret text, new_secret text)
RETURNS void
LANGUAGE sql AS $$
    DELETE FROM pgmb_worker_secret s
    WHERE s.worker_id = retire_secret.worker_id
      AND (s.secret = new_secret OR s.expires_at <= now());
    INSERT INTO pgmb_worker_secret (worker_id, secret, retired_at, expires_at)
    SELECT retire_secret.worker_id, old_secret, now(), now() + pgmb.secret_overlap()
    WHERE old_secret <> '' AND pgmb.secret_problem(old_secret) IS NULL
    ON CONFLICT (worker_id, secret)
    DO UPDATE SET retired_at = excluded.retired_at, expires_at = excluded.expires_at;
    DELETE FROM pgmb_worker_secret s
    WHERE s.worker_id = retire_secret.worker_id
      AND s.id NOT IN (SELECT k.id FROM pgmb_worker_secret k
                       WHERE k.worker_id = retire_secret.worker_id
                       ORDER BY k.retired_at DESC, k.id DESC
                       LIMIT pgmb.max_retiring_secrets());
$$;

-- The BEFORE INSERT OR UPDATE trigger function of pgmb_worker: the name, endpoint, rate,
-- timeout and secret rules for every writer (an unchanged endpoint or secret stays
-- accepted: a row stored before a rule can still be paused), then the circuit breaker's settings (pgmb.check_breaker).
CREATE OR REPLACE FUNCTION pgmb.prepare_worker(w public.pgmb_worker) RETURNS public.pgmb_worker
    LANGUAGE plpgsql
    AS $_$
DECLARE
    problem text;
BEGIN
    PERFORM pgmb.check_name('worker', w.name);
    IF (w.endpoint IS NULL
        OR w.endpoint !~ '^[Hh][Tt][Tt][Pp][Ss]?://(?:[^/?#\[\]\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]*@)?(?:\[[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\]|[^/?#@\[\]:\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]+)(?::(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])?)?(?:[/?#][^\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]*)?$')
       AND NOT EXISTS (SELECT 1 FROM pgmb_worker o WHERE o.id = w.id AND o.endpoint = w.endpoint) THEN
        -- Named with its credentials masked: an error text reaches logs and screens.
        RAISE EXCEPTION 'invalid endpoint % for worker %', quote_nullable(pgmb.mask_credentials(w.endpoint)), w.name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The endpoint must be an http:// or https:// URL without blanks, its host a name, an IPv4 address or an IPv6 address in brackets, its port (if any) from 1 to 65535.';
    END IF;
    IF w.rps IS NULL OR w.rps <= 0 THEN
        RAISE EXCEPTION 'invalid rps % for worker %: it must be at least 1 request per second', w.rps, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.timeout IS NULL OR w.timeout <= 0 THEN
        RAISE EXCEPTION 'invalid timeout % for worker %: it must be positive', w.timeout, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    problem := pgmb.new_secret_problem(w.secret);
    IF problem IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM pgmb_worker o WHERE o.id = w.id AND o.secret = w.secret) THEN
        RAISE EXCEPTION 'invalid secret for worker %: %', w.name, problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use whsec_ and the base64 of at least 16 bytes (padded or not), or a text of at least 16 bytes without control characters.';
    END IF;
    w := pgmb.check_breaker(w);
    RETURN w;
END $_$;

-- The default endpoint policy's networks (docs/decisions/0059-endpoint-presets.md).

-- The networks the default endpoint policy refuses: pgmb.conf.DEFAULT_ENDPOINT_POLICY's
-- deny list (link-local, the metadata services, also through NAT64 and 6to4; one table of
-- cases compares them, tests/rules/test_endpoint_presets.py).
CREATE OR REPLACE FUNCTION pgmb.default_endpoint_deny() RETURNS cidr[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '{169.254.0.0/16,fe80::/10,fd00:ec2::254/128,100.100.100.200/32,64:ff9b::a9fe:0/112,64:ff9b::6464:64c8/128,2002:a9fe::/32,2002:6464:64c8::/48}'::cidr[]
$$;

ALTER TABLE pgmb.endpoint_policy ALTER COLUMN deny SET DEFAULT pgmb.default_endpoint_deny();
-- A database on 0.1.0's default policy moves to 0.1.1's default (what migrate writes from
-- the settings next anyway), so that it is still recognised as the default meanwhile.
UPDATE pgmb.endpoint_policy SET deny = pgmb.default_endpoint_deny()
WHERE allow = '{}' AND deny = '{169.254.0.0/16,fe80::/10}';

-- Whether the database's endpoint policy refuses address (the PL/Python transport asks
-- before it connects).
CREATE OR REPLACE FUNCTION pgmb.endpoint_refused(address inet) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT pgmb.endpoint_refused(address, p.allow, p.deny)
                     FROM pgmb.endpoint_policy AS p),
                    pgmb.endpoint_refused(address, '{}', pgmb.default_endpoint_deny()))
$$;

-- Whether the database's endpoint policy is the default one. pgsql-http resolves, connects
-- and follows redirects inside libcurl, where no policy can be checked: it is used only
-- under the default policy (whose link-local refusal it cannot enforce either; the
-- documented gap of the default).
CREATE OR REPLACE FUNCTION pgmb.endpoint_policy_is_default() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT p.allow = '{}' AND p.deny = pgmb.default_endpoint_deny()
                     FROM pgmb.endpoint_policy AS p), true)
$$;

-- Closed by default, as every function of pgmb's not in access.sql's reviewed list.
REVOKE EXECUTE ON FUNCTION pgmb.new_secret_problem(text), pgmb.max_retiring_secrets(),
    pgmb.default_endpoint_deny() FROM PUBLIC;


-- ==== Installation and privileges ====

-- What the owner creates in schema pgmb later is not executable by PUBLIC, where the owner
-- is not a superuser (access.sql).
DO $$
BEGIN
    IF NOT current_setting('is_superuser')::boolean THEN
        ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON ROUTINES FROM PUBLIC;
    END IF;
END $$;

