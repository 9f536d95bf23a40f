-- A circuit breaker per worker (endpoint protection). A worker whose endpoint keeps failing
-- is paused by itself: after `breaker_failures` failures in a row, or once the failures
-- reach `breaker_rate` of its requests over the last `breaker_window` seconds (with at least
-- `breaker_min_requests` of them), its breaker opens and pgmb.claim skips the worker: its
-- deliveries stay ready, their attempts untouched. After `breaker_cooldown` seconds a claim
-- hands out one delivery, the probe (half-open); its success closes the breaker, its failure
-- opens it again for twice the last cool-down, at most `breaker_cooldown_max`. Off by
-- default (both triggers NULL).
--
-- What counts as the endpoint's failure (pgmb.breaker_counts): no answer (a network error,
-- a timeout, a lease of a started request that expired), a 5xx, 408, 429, and any other
-- answer that is neither 2xx nor 4xx (a redirect: the endpoint is misconfigured). A 4xx
-- other than 408 and 429 is the message's fault: the endpoint answered.
-- A failure of pgmb's own (pgmb.own_failure: the request could not be built or encoded, or
-- the endpoint policy refused the address) is neither: the endpoint was asked nothing, so
-- it counts for nothing here, not even as a request; a probe that failed so hands its turn
-- to the next delivery at once.
--
-- Every transition is made here, by pgmb.breaker_settle (called by pgmb.ack and
-- pgmb.settle_failures, so both dispatch paths share it), pgmb.breaker_admit (called by
-- pgmb.claim for a worker whose breaker is not closed) and pgmb.breaker_reset (the admin's
-- action), and each one raises a WARNING (SQLSTATE 01PB0, DETAIL a JSON object with the
-- worker, the state and the reason), which the external dispatcher logs and the server log
-- keeps. The settings and the state are columns of pgmb_worker (pgmb/models.py).

-- The settings' rules (pgmb.models.Worker.clean says the same), and a breaker turned off
-- closes: what it held back is claimable at once.
CREATE OR REPLACE FUNCTION pgmb.check_breaker(w pgmb_worker) RETURNS pgmb_worker
LANGUAGE plpgsql AS $$
BEGIN
    IF w.breaker_failures IS NOT NULL AND w.breaker_failures NOT BETWEEN 0 AND 1000000 THEN
        RAISE EXCEPTION 'invalid breaker_failures % for worker %: 1 to 1000000 failures in a row, or 0 or NULL (off)',
                        w.breaker_failures, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.breaker_rate IS NOT NULL AND NOT (w.breaker_rate > 0 AND w.breaker_rate <= 1) THEN
        RAISE EXCEPTION 'invalid breaker_rate % for worker %: a share of failed requests above 0 and at most 1, or NULL (off)',
                        w.breaker_rate, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.breaker_window IS NULL OR NOT (w.breaker_window > 0 AND w.breaker_window <= 86400) THEN
        RAISE EXCEPTION 'invalid breaker_window % for worker %: seconds above 0, at most 86400',
                        w.breaker_window, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.breaker_min_requests IS NULL OR w.breaker_min_requests NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'invalid breaker_min_requests % for worker %: 1 to 1000000 requests',
                        w.breaker_min_requests, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.breaker_cooldown IS NULL OR NOT (w.breaker_cooldown > 0 AND w.breaker_cooldown <= 86400) THEN
        RAISE EXCEPTION 'invalid breaker_cooldown % for worker %: seconds above 0, at most 86400',
                        w.breaker_cooldown, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.breaker_cooldown_max IS NULL
       OR NOT (w.breaker_cooldown_max >= w.breaker_cooldown AND w.breaker_cooldown_max <= 86400) THEN
        RAISE EXCEPTION 'invalid breaker_cooldown_max % for worker %: seconds from breaker_cooldown (%) to 86400',
                        w.breaker_cooldown_max, w.name, w.breaker_cooldown
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF coalesce(w.breaker_failures, 0) = 0 AND w.breaker_rate IS NULL AND w.breaker_state <> 'closed' THEN
        w.breaker_state := 'closed';
        w.breaker_since := clock_timestamp();
        w.breaker_until := NULL;
        w.breaker_probe := NULL;
        w.breaker_reason := 'breaker turned off';
    END IF;
    RETURN w;
END $$;

-- Whether an outcome is the endpoint's failure (see the top of this file).
CREATE OR REPLACE FUNCTION pgmb.breaker_counts(status integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT status IS NULL
        OR NOT (status BETWEEN 200 AND 299 OR (status BETWEEN 400 AND 499 AND status NOT IN (408, 429)))
$$;

-- Whether an outcome is a failure of pgmb's own (see the top of this file): no status, and
-- an error that begins with the text of pgmb.dispatch.client.OWN_FAILURE, which both dispatch
-- paths write and nothing an endpoint sends can produce (an answer's outcome has a status;
-- the errors of no answer are the dispatchers' own words).
CREATE OR REPLACE FUNCTION pgmb.own_failure(status integer, error text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT status IS NULL AND starts_with(coalesce(error, ''), 'pgmb''s own failure: ')
$$;

-- Seconds a breaker stays open after its n-th opening in a row: the cool-down, doubled
-- for each failed probe, at most the cap.
CREATE OR REPLACE FUNCTION pgmb.breaker_cooldown(cooldown float8, cooldown_max float8, trips integer) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT least(cooldown_max, cooldown * 2 ^ least(greatest(trips - 1, 0), 30))
$$;

-- Tell whoever listens (the dispatcher's log, the server log, a queue bound to
-- pgmb.breaker.* when events are on) of a transition, once: each transition is made by one
-- transaction, which raises this once.
CREATE OR REPLACE FUNCTION pgmb.breaker_announce(worker_name text, state text, reason text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE WARNING 'pgmb: circuit breaker of worker % is %: %', worker_name, replace(state, '_', '-'), reason
        USING ERRCODE = '01PB0',
              DETAIL = json_build_object('worker', worker_name, 'state', state, 'reason', reason)::text;
    IF state = 'closed' THEN
        -- Its deliveries are claimable again: wake dispatchers that sleep (none: no cost).
        PERFORM pgmb.wake_dispatchers();
    END IF;
    -- Opening and closing are events (events.sql; nothing when they are off). Half-open is
    -- the breaker's own business: the probe's outcome opens or closes it again.
    IF state IN ('open', 'closed') THEN
        PERFORM pgmb.publish_event(CASE state WHEN 'open' THEN 'pgmb.breaker.opened' ELSE 'pgmb.breaker.closed' END,
                                   jsonb_build_object('worker', worker_name, 'state', state, 'reason', reason));
    END IF;
END $$;

-- The outcomes of a batch for the breakers of their workers, in order. Called first thing by
-- pgmb.ack (acked: every outcome a success) and pgmb.settle_failures (each counted by
-- pgmb.breaker_counts; lease ids fence them as there), before they change the deliveries.
-- Locks the deliveries first, then the workers in id order, as reclaim_expired does
-- (deliveries, then in settle_failures the workers): no deadlock. Returns the transitions.
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

-- An outcome in a few words, for a breaker's reason.
CREATE OR REPLACE FUNCTION pgmb.breaker_describe(status integer, error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT left(coalesce(nullif(error, ''), 'HTTP ' || status, 'no answer'), 200)
$$;

-- Called by pgmb.claim, which holds the worker's row, for a worker whose breaker is not
-- closed: how many of `tokens` deliveries it may take. Open and cooling down, or its probe
-- out: none. Otherwise one, the probe (half-open), fenced by the claim's lease; until the
-- longest lease of the worker's queues has run out no other probe goes (an outcome comes by
-- then, or the expiry's: pgmb.reclaim_expired).
CREATE OR REPLACE FUNCTION pgmb.breaker_admit(worker_id uuid, tokens integer, t timestamptz, lease uuid) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    w pgmb_worker;
BEGIN
    SELECT * INTO w FROM pgmb_worker wk WHERE wk.id = worker_id;
    IF w.breaker_state = 'closed' THEN
        RETURN tokens;
    END IF;
    IF tokens <= 0 OR w.breaker_until > t THEN
        RETURN 0;
    END IF;
    UPDATE pgmb_worker wk
    SET breaker_state = 'half_open', breaker_probe = lease,
        breaker_since = CASE WHEN w.breaker_state = 'open' THEN t ELSE wk.breaker_since END,
        breaker_until = t + (SELECT least(max(q.lease_seconds), 2592000) FROM pgmb_queue q
                             WHERE q.worker_id = wk.id) * interval '1 second',
        breaker_reason = CASE WHEN w.breaker_state = 'open'
                              THEN 'cool-down over: one delivery probes the endpoint'
                              ELSE 'the probe went without an outcome: another probes the endpoint' END
    WHERE wk.id = worker_id;
    IF w.breaker_state = 'open' THEN
        PERFORM pgmb.breaker_announce(w.name, 'half_open', 'cool-down over: one delivery probes the endpoint');
    END IF;
    RETURN 1;
END $$;

-- Close breakers by hand (the admin's action): their workers' deliveries are claimable at
-- once. Returns how many were not closed.
CREATE OR REPLACE FUNCTION pgmb.breaker_reset(worker_ids uuid[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    w record;
    n integer := 0;
BEGIN
    FOR w IN
        UPDATE pgmb_worker wk
        SET breaker_state = 'closed', breaker_since = clock_timestamp(), breaker_until = NULL,
            breaker_probe = NULL, breaker_reason = 'closed by hand', breaker_streak = 0, breaker_trips = 0,
            breaker_window_at = NULL, breaker_requests = 0, breaker_failed = 0,
            breaker_prev_requests = 0, breaker_prev_failed = 0
        FROM (SELECT o.id FROM pgmb_worker o WHERE o.id = ANY (worker_ids) AND o.breaker_state <> 'closed'
              ORDER BY o.id FOR UPDATE) AS chosen
        WHERE wk.id = chosen.id
        RETURNING wk.name
    LOOP
        PERFORM pgmb.breaker_announce(w.name, 'closed', 'closed by hand');
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;
