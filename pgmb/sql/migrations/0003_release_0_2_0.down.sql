-- Reverse of 0003_release_0_2_0: puts back 0.1.1's objects that it changed, by concern in
-- the same order as the forward file; a function several concerns changed is put back once,
-- in the first of them.

-- ==== Pull: history when asked, reads and deletes ====

-- Creates a queue; the documented argument order: (name, binding_key, max_retries,
-- worker_id). worker_id NULL makes a pull queue; an unknown worker id is an error.
-- Returns the queue's id.
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

-- Settles read deliveries of one pull queue: deleted from the hot table, one history row
-- each with outcome ('ack' or 'archived'). Returns the ids settled. Ids of another queue
-- are an error; as it is raised after the delete, the delete is undone with the statement,
-- and the common case pays no second look-up.
CREATE OR REPLACE FUNCTION pgmb.settle_reads(queue_name text, delivery_ids bigint[], outcome text)
RETURNS SETOF bigint LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
AS $$
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

DROP FUNCTION pgmb.set_keep_history(text, boolean);
DROP FUNCTION pgmb.create(text, text, integer, uuid, boolean);
DROP FUNCTION pgmb.check_keep_history(text, uuid, boolean);
ALTER TABLE pgmb_queue DROP CONSTRAINT pgmb_queue_history_pull_only;

-- ==== Pull: reads and deletes, design B ====

CREATE OR REPLACE FUNCTION pgmb.read(queue_name text, vt double precision, qty integer, filter jsonb DEFAULT NULL::jsonb) RETURNS SETOF pgmb.pull_message
LANGUAGE plpgsql AS $$
DECLARE
    -- First, before any expression a planted operator could match (tables.sql).
    closed boolean := pgmb.refuse_writable_schemas();
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
            DELETE FROM pgmb_delivery d
            WHERE d.id = ANY (ARRAY(SELECT p.id FROM picked p WHERE p.exhausted))
            RETURNING d.message_id, d.queue_id, d.attempts, d.last_status,
                      format('read %s times and never deleted (max_retries %s): dead-lettered instead of read again',
                             d.attempts, (SELECT p.max_retries FROM picked p WHERE p.id = d.id)) AS error
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
            WHERE d.id = ANY (ARRAY(SELECT p.id FROM picked p WHERE NOT p.exhausted))
            RETURNING d.id, d.message_id, d.attempts, d.created_at, d.available_at, d.priority
        )
        SELECT array_agg(ROW(r.id, r.message_id, r.attempts, r.created_at, r.available_at,
                             m.body, m.headers, m.routing_key)::pgmb.pull_message
                         ORDER BY r.priority, p.was, r.id),
               (SELECT count(*) FROM history)
        INTO got, buried
        FROM r JOIN picked p ON p.id = r.id JOIN pgmb_message m ON m.id = r.message_id;
        IF got IS NOT NULL THEN
            RETURN QUERY SELECT * FROM unnest(got);
            remaining := remaining - cardinality(got);
        END IF;
        -- Only dead-lettered rows make room for more in the same read.
        EXIT WHEN buried = 0 OR remaining <= 0;
        seen := seen || ARRAY(SELECT g.delivery_id FROM unnest(got) AS g);
    END LOOP;
END $$;

-- pgmb.read acts for its caller and keeps its planner settings (both are the function's
-- own, which CREATE OR REPLACE resets; pull.sql).
SELECT pgmb.pin_definers(ARRAY['pgmb.read(text, double precision, integer, jsonb)']);
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off;

-- ==== Tasks: a task enqueued by one function call ====

DROP FUNCTION pgmb.enqueue_task(uuid, text, jsonb, integer, text, text, text, integer,
                                timestamptz, jsonb, jsonb, jsonb);

-- ==== In-database loop: named steps and the http extension's path ====

-- 0.1.1's loop, its pgmb.post_via_http and pgmb.http_outcome, and its pgmb.cron_install;
-- then the steps and constants 0.2.0 added are dropped.

-- The outcome of an HTTP answer, as pgmb/dispatch/client.py classifies it.
CREATE OR REPLACE FUNCTION pgmb.http_outcome(status integer, content text, location text, retry_after text,
                                             started timestamptz, body_limit integer DEFAULT 500)
RETURNS pgmb.http_outcome
LANGUAGE sql STABLE AS $$
    SELECT ROW(status,
               CASE WHEN status BETWEEN 200 AND 299 THEN ''
                    ELSE trim(format('HTTP %s%s: %s', status,
                                     CASE WHEN status BETWEEN 300 AND 399
                                          THEN format(' redirect to %s (not followed)', coalesce(location, '?')) ELSE '' END,
                                     left(coalesce(content, ''), body_limit))) END,
               CASE WHEN status IN (429, 503) THEN pgmb.retry_after_seconds(retry_after) END,
               extract(epoch FROM clock_timestamp() - started) * 1000)::pgmb.http_outcome
$$;

-- POST through pgsql-http. Called through EXECUTE so that this file installs without it.
-- pgsql-http follows redirects itself (up to 5) and has no option to stop it.
CREATE OR REPLACE FUNCTION pgmb.post_via_http(url text, body text, headers jsonb, timeout float8)
RETURNS pgmb.http_outcome
LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz := clock_timestamp();
    status integer;
    content text;
    location text;
    retry_after text;
BEGIN
    EXECUTE 'SELECT http_set_curlopt(''CURLOPT_TIMEOUT_MS'', $1)' USING ceil(timeout * 1000)::bigint::text;
    EXECUTE $q$
        SELECT (r).status, (r).content,
               (SELECT h.value FROM unnest((r).headers) AS h WHERE lower(h.field) = 'location' LIMIT 1),
               (SELECT h.value FROM unnest((r).headers) AS h WHERE lower(h.field) = 'retry-after' LIMIT 1)
        FROM (SELECT http(('POST', $1,
                           (SELECT coalesce(array_agg(http_header(k, v)), '{}')
                            FROM jsonb_each_text($2) AS e(k, v) WHERE lower(k) <> 'content-type'),
                           'application/json', $3)::http_request) AS r) AS response
    $q$ INTO status, content, location, retry_after USING url, headers, body;
    RETURN pgmb.http_outcome(status, content, location, retry_after, started);
EXCEPTION WHEN others THEN
    RETURN ROW(NULL, 'HTTP request failed: ' || SQLERRM, NULL,
               extract(epoch FROM clock_timestamp() - started) * 1000)::pgmb.http_outcome;
END $$;

-- Schedule (or re-schedule) pgmb's jobs. pg_cron >= 1.5 runs a short loop every second;
-- 1.4 (Debian 12) has only minutes, so a per-minute job loops for 55 s.
CREATE OR REPLACE FUNCTION pgmb.cron_install(batch integer DEFAULT 50) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    version integer[] := pgmb.cron_version();
    schedule text;
    command text;
BEGIN
    IF version IS NULL THEN
        RAISE EXCEPTION 'pg_cron is not installed in this database'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Preload it (shared_preload_libraries = ''pg_cron''), point cron.database_name here, then CREATE EXTENSION pg_cron.';
    END IF;
    IF version >= ARRAY[1, 5] THEN
        schedule := '1 seconds';
        command := format('CALL pgmb.dispatch_loop(0.9, %s, as_job => true)', batch);
    ELSE
        schedule := '* * * * *';
        command := format('CALL pgmb.dispatch_loop(55, %s, as_job => true)', batch);
    END IF;
    EXECUTE 'SELECT cron.schedule($1, $2, $3)' USING 'pgmb-dispatch', schedule, command;
    EXECUTE 'SELECT cron.schedule($1, $2, $3)' USING 'pgmb-maintenance', '* * * * *', 'SELECT pgmb.maintenance()';
    RETURN format('pgmb-dispatch: %s  %s', schedule, command);
END $$;

-- The in-database dispatcher: claims, posts and records outcomes for `seconds`, in
-- batches, committing between them (pg_cron runs it as a job, as_job). With the PL/Python
-- transport a batch's requests to one worker go out as runs (pgmb.post_run_via_plpython);
-- with the http extension one at a time. Outcomes are written in batches (pgmb.record_outcomes)
-- within the bounds of pgmb.indb_commit_bounds. A fault in one request is that delivery's
-- outcome, never the loop's end.
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

-- The value of the pgmb-routing-key header of a routing key, as
-- pgmb.worker_request.routing_key_header gives it: printable ASCII but '%' as it is, every
-- other character as the percent-encoded bytes of its UTF-8 (RFC 3986, upper-case hex), so
-- that the header is ASCII on every path and a worker gets the key back with any URL-unquote.
-- Most keys are all kept: one match, no copy.
CREATE OR REPLACE FUNCTION pgmb.routing_key_header(routing_key text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN routing_key ~ '^[\x21-\x24\x26-\x7e]*$' THEN routing_key
                ELSE (SELECT string_agg(CASE WHEN ch ~ '^[\x21-\x24\x26-\x7e]$' THEN ch
                                             ELSE upper(regexp_replace(encode(convert_to(ch, 'UTF8'), 'hex'),
                                                                       '(..)', '%\1', 'g')) END,
                                        '' ORDER BY n)
                      FROM regexp_split_to_table(routing_key, '') WITH ORDINALITY AS t(ch, n)) END
$$;

DROP PROCEDURE pgmb.loop_record(bigint[], uuid[], pgmb.http_outcome[]);
DROP FUNCTION
    pgmb.loop_claim(text[], integer),
    pgmb.loop_reclaim(),
    pgmb.loop_beat(bigint, integer, bigint, bigint),
    pgmb.loop_headers(pgmb.claimed[]),
    pgmb.loop_post(pgmb.claimed, text, jsonb, text),
    pgmb.http_header_records(jsonb[]),
    pgmb.post_via_http_headers(text, text, text, float8),
    pgmb.routing_key_escaped(text),
    pgmb.loop_post_run(pgmb.claimed[], integer, boolean, timestamptz, integer, float8, timestamptz, float8, timestamptz),
    pgmb.unpaced_rps(),
    pgmb.indb_heartbeat_interval(),
    pgmb.indb_reclaim_interval(),
    pgmb.indb_batch();

-- ==== Claims: one plan a session ====

ALTER FUNCTION pgmb.claim(text[], integer) SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION pgmb.start(bigint[], uuid[]) SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION pgmb.ack(bigint[], integer[], double precision[]) SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION pgmb.settle_failures(bigint[], uuid[], integer[], text[], double precision[], double precision[], text)
    SET plan_cache_mode = force_custom_plan;

CREATE OR REPLACE FUNCTION pgmb.signing_secrets(current text, worker_id uuid, at timestamptz)
RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT array_remove(ARRAY[current], '') || ARRAY(
        SELECT s.secret::text FROM pgmb_worker_secret s
        WHERE s.worker_id = signing_secrets.worker_id AND s.expires_at > at
        ORDER BY s.retired_at DESC, s.id DESC
        LIMIT pgmb.max_retiring_secrets())
$$;
-- django-pgtrigger leaves a removed trigger's function behind.
DROP FUNCTION IF EXISTS pgtrigger_worker_validate_update_3bb89();

-- ==== Publishing: indexes that earn their place ====
-- 0.1.1 left pgmb_queue to autovacuum's defaults (its statistics stay as they are).
ALTER TABLE pgmb_queue RESET (autovacuum_analyze_threshold, autovacuum_analyze_scale_factor);

-- ==== History partitioned by time ====

-- Housekeeping for the pg_cron path: expired leases, pg_cron's own run log, the rows
-- of dispatchers stopped or gone for longer than `keep`, and expired retiring secrets.
CREATE OR REPLACE FUNCTION pgmb.maintenance(keep interval DEFAULT '1 day') RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    reclaimed integer := pgmb.reclaim_expired(10000);
BEGIN
    IF to_regclass('cron.job_run_details') IS NOT NULL THEN
        EXECUTE 'DELETE FROM cron.job_run_details WHERE end_time < now() - $1' USING keep;
    END IF;
    DELETE FROM pgmb_dispatcher d
    WHERE coalesce(d.stopped_at, d.heartbeat_at) < now() - keep
      AND pgmb.dispatcher_state(d.heartbeat_at, d.stopped_at) <> 'running';
    PERFORM pgmb.forget_expired_secrets();
    RETURN reclaimed;
END $$;

-- Each history table back to one plain table: the day partitions' rows go into the
-- default partition (the table as it was before), which takes the table's name, indexes,
-- triggers, statistics, grants and views back; then the functions of this section go.
CREATE FUNCTION pg_temp.unpartition_history_table(tbl name) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    parent regclass := tbl::regclass;
    part name := tbl || '_default';
    views text[];
    functions text[];
    names text[];
    acls text[];
    triggers text[];
    statistics text[];
    identities text[];
    i record;
    g record;
    def text;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = parent) <> 'p' THEN
        RETURN;
    END IF;
    -- A column drawing from a sequence the parent owns was an identity column (the
    -- conversion made it a default): made an identity again with the sequence's name,
    -- options, state and grants, once the parent and its sequence are gone.
    identities := ARRAY(
        SELECT x.statement
        FROM pg_attribute a
        JOIN pg_sequence q ON q.seqrelid = pg_get_serial_sequence(parent::text, a.attname)::regclass
        CROSS JOIN LATERAL (
            SELECT 1, format('ALTER TABLE %I ALTER COLUMN %I ADD GENERATED BY DEFAULT AS IDENTITY'
                             ' (SEQUENCE NAME %s INCREMENT %s MINVALUE %s MAXVALUE %s START %s CACHE %s %s)',
                             tbl, a.attname, q.seqrelid::regclass, q.seqincrement, q.seqmin, q.seqmax,
                             q.seqstart, q.seqcache, CASE WHEN q.seqcycle THEN 'CYCLE' ELSE 'NO CYCLE' END)
            UNION ALL
            SELECT 2, format('SELECT setval(%L, %s)', q.seqrelid::regclass::text, pg_sequence_last_value(q.seqrelid))
            WHERE pg_sequence_last_value(q.seqrelid) IS NOT NULL
            UNION ALL
            SELECT 3, format('GRANT %s ON SEQUENCE %s TO %s', e.privilege_type, q.seqrelid::regclass,
                             CASE WHEN e.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(e.grantee::regrole::text) END)
            FROM pg_class c, aclexplode(c.relacl) e
            WHERE c.oid = q.seqrelid AND e.grantee <> c.relowner) AS x(step, statement)
        WHERE a.attrelid = parent AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum, x.step);
    views := ARRAY(SELECT DISTINCT format('CREATE OR REPLACE VIEW %s AS %s', v.oid::regclass,
                                          pg_get_viewdef(v.oid))
                   FROM pg_depend d JOIN pg_rewrite w ON w.oid = d.objid
                   JOIN pg_class v ON v.oid = w.ev_class
                   WHERE d.refobjid = parent AND d.classid = 'pg_rewrite'::regclass AND v.oid <> parent);
    functions := ARRAY(SELECT pg_get_functiondef(p.oid) FROM pg_proc p
                       WHERE (SELECT reltype FROM pg_class WHERE oid = parent) = ANY (p.proargtypes::oid[])
                       ORDER BY p.oid);
    -- Their signatures once the table has its name back (the same text), and grants.
    names := ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p
                   WHERE (SELECT reltype FROM pg_class WHERE oid = parent) = ANY (p.proargtypes::oid[])
                   ORDER BY p.oid);
    acls := ARRAY(SELECT coalesce(p.proacl, '{}')::text FROM pg_proc p
                  WHERE (SELECT reltype FROM pg_class WHERE oid = parent) = ANY (p.proargtypes::oid[])
                  ORDER BY p.oid);
    triggers := ARRAY(SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t
                      WHERE t.tgrelid = parent AND NOT t.tgisinternal ORDER BY t.tgname);
    statistics := ARRAY(SELECT pg_get_statisticsobjdef(s.oid) FROM pg_statistic_ext s WHERE s.stxrelid = parent);
    FOR i IN SELECT s.stxnamespace::regnamespace::name AS nsp, s.stxname FROM pg_statistic_ext s
             WHERE s.stxrelid = parent LOOP
        EXECUTE format('DROP STATISTICS %I.%I', i.nsp, i.stxname);
    END LOOP;
    FOR i IN SELECT t.tgname FROM pg_trigger t WHERE t.tgrelid = parent AND NOT t.tgisinternal LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', i.tgname, parent);
    END LOOP;
    FOR i IN SELECT p.oid FROM pg_proc p
             WHERE (SELECT reltype FROM pg_class WHERE oid = parent) = ANY (p.proargtypes::oid[]) LOOP
        EXECUTE format('DROP FUNCTION %s', i.oid::regprocedure);
    END LOOP;
    EXECUTE format('ALTER TABLE %s DETACH PARTITION %I', parent, part);
    FOR i IN SELECT c.oid::regclass AS day FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
             WHERE h.inhparent = parent LOOP
        EXECUTE format('INSERT INTO %I SELECT * FROM %s', part, i.day);
    END LOOP;
    EXECUTE format('ALTER TABLE %s RENAME TO %I', parent, tbl || '_partitioned');
    EXECUTE format('ALTER TABLE %I RENAME TO %I', part, tbl);
    FOREACH def IN ARRAY statistics || triggers || views || functions LOOP
        EXECUTE def;
    END LOOP;
    -- The functions of the row type made again keep their grants (closed to PUBLIC).
    FOR i IN SELECT p.oid, f.acl FROM unnest(names, acls) AS f(name, acl)
             JOIN pg_proc p ON p.oid::regprocedure::text = f.name LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', i.oid::regprocedure);
        FOR g IN SELECT a.grantee FROM aclexplode(i.acl::aclitem[]) a
                 WHERE a.grantee <> (SELECT proowner FROM pg_proc WHERE oid = i.oid) LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', i.oid::regprocedure,
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END);
        END LOOP;
    END LOOP;
    EXECUTE format('DROP TABLE %I', tbl || '_partitioned');
    FOREACH def IN ARRAY identities LOOP
        EXECUTE def;
    END LOOP;
    FOR i IN SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
             WHERE x.indrelid = tbl::regclass AND c.relname LIKE part || '%' LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', i.relname, tbl || substring(i.relname FROM length(part) + 1));
    END LOOP;
END $$;

-- 0.1.1's pgmb.duplicated for a stored message, inlined into the routing trigger's statement.
CREATE OR REPLACE FUNCTION pgmb.duplicated(dedup_window float8, pattern text, message_id uuid,
                                           dedup_id text, created_at timestamptz)
RETURNS SETOF uuid
LANGUAGE sql STABLE AS $$
    SELECT pgmb.duplicated(dedup_window, pattern, message_id, dedup_id, created_at,
                           (SELECT m.producer FROM pgmb_message m WHERE m.id = duplicated.message_id))
$$;

-- Printed while the tables are partitioned, the views and functions name the parent;
-- made again, they name the plain table.
SELECT pg_temp.unpartition_history_table('pgmb_message');
SELECT pg_temp.unpartition_history_table('pgmb_attempt');
DROP FUNCTION pgmb.retire_history(interval, boolean), pgmb.premake_history(integer, bigint),
    pgmb.make_history_days(date, date, bigint), pgmb.estimated_rows(regclass), pgmb.history_scan_limit(),
    pgmb.rows_between(regclass, name, uuid, uuid, bigint),
    pgmb.history_far_day(), pgmb.history_days(),
    pgmb.partition_history_table(name, name), pgmb.history_tables(), pgmb.day_floor(date),
    pgmb.copy_table_grants(regclass, regclass);

-- A dispatcher found nothing to claim and is about to wait: mark it waiting. True once no
-- message insert is in flight, after which every publisher sees the mark; false if one
-- is (the caller claims again shortly and calls this again before it sleeps for long).
CREATE OR REPLACE FUNCTION pgmb.dispatcher_idle(dispatcher_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pgmb_dispatcher d SET waiting = true WHERE d.id = dispatcher_id AND d.waiting IS NOT true;
    BEGIN
        LOCK TABLE pgmb_message IN SHARE MODE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    RETURN true;
END $$;

-- ==== Archive by day ====

-- pgmb_archive_day goes with its model. Tables of days a run detached and has not dropped
-- yet (pgmb_archive_<run>_*) stay: their rows are in no other table.
DROP FUNCTION pgmb.claim_history_day(bigint, date, timestamptz);

-- ==== Answers that stop retries ====
-- 0.1.1's functions (pgmb.post_via_http_headers is 0.2.0's: its section drops it); the
-- columns are dropped by Django after this file.

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

CREATE OR REPLACE FUNCTION pgmb.settle_failures(delivery_ids bigint[], lease_ids uuid[], statuses integer[], errors text[], retry_after double precision[], durations_ms double precision[], retry_outcome text) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode = force_custom_plan SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
    AS $$
DECLARE
    settled integer;
BEGIN
    PERFORM pgmb.breaker_settle(delivery_ids, lease_ids, statuses, errors, false);  -- circuit breakers (breakers.sql)
    WITH input AS (
        SELECT * FROM unnest(delivery_ids, lease_ids, statuses, errors, retry_after, durations_ms)
            AS u(id, lease_id, status, error, retry_after, duration_ms)
    ), target AS (
        SELECT d.id, d.message_id, d.queue_id, d.attempts, u.status, left(coalesce(u.error, ''), 2000) AS error,
               u.retry_after, u.duration_ms,
               d.attempts >= 1 + coalesce(m.max_retries, q.max_retries) AS exhausted,
               q.backoff_base, q.backoff_max, m.retry_delay
        FROM input u
        JOIN pgmb_delivery d ON d.id = u.id AND d.id = ANY (delivery_ids) AND d.lease_id = u.lease_id AND d.state = 'leased'
        JOIN pgmb_queue q ON q.id = d.queue_id
        JOIN pgmb_message m ON m.id = d.message_id
        FOR UPDATE OF d
    ), dead AS (
        DELETE FROM pgmb_delivery d USING target t
        WHERE d.id = t.id AND d.id = ANY (delivery_ids) AND t.exhausted
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
        WHERE d.id = t.id AND d.id = ANY (delivery_ids) AND NOT t.exhausted
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

DROP FUNCTION IF EXISTS pgmb.final_answer_note(integer, text, text[], text[]),
    pgmb.check_final_answers(public.pgmb_worker), pgmb.statuses_normalised(text[]),
    pgmb.statuses_problem(text[], boolean), pgmb.aborted_prefix(), pgmb.abort_value(),
    pgmb.abort_header();

-- ==== A cap on requests in flight ====
-- 0.1.1's functions, then the cap's own objects dropped; the column is dropped by Django
-- after this file.

-- 0.1.1's pgmb.next_wakeup, which the sections "A cap on requests in flight", "Fair shares
-- per key" and "Schedules" changed.
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

-- Leases up to max_count due deliveries of the named queues (all when NULL), most urgent
-- first (priority, due time, publish order), within each worker's rate limit and circuit
-- breaker; counts the attempt. The hot statements of the claim, pgmb.start, pgmb.ack and
-- pgmb.settle_failures are planned at every call (plan_cache_mode), with the scans that an
-- estimate could pick over a queue's index turned off: a plan cached for an empty queue, or
-- made from stale statistics, would otherwise read the whole table. Rows are found through
-- the primary key (id = ANY (...)), and the claim picks into an array first and returns its
-- rows in the order picked.
CREATE OR REPLACE FUNCTION pgmb.claim(queue_names text[] DEFAULT NULL::text[], max_count integer DEFAULT 100) RETURNS SETOF pgmb.claimed
    LANGUAGE plpgsql
    SET plan_cache_mode = force_custom_plan SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
    SET enable_sort = off
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
    bucket float8;
    taken integer;
    picked bigint[];
    secrets text[];
BEGIN
    FOR w IN
        SELECT wk.id, array_agg(qu.id ORDER BY random()) AS queue_ids
        FROM pgmb_queue qu JOIN pgmb_worker wk ON wk.id = qu.worker_id
        WHERE NOT qu.paused AND wk.active
          AND (wk.breaker_until IS NULL OR wk.breaker_until <= t)  -- an open circuit breaker (breakers.sql)
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
        -- serving this worker: skip it rather than wait (as with deliveries). Refilled here,
        -- written once below, less what was taken.
        SELECT least(greatest(1, wk.rps * wk.burst),
                     wk.tokens + wk.rps * extract(epoch FROM t - coalesce(wk.tokens_at, t - interval '1 day'))),
               wk.breaker_state,
               -- Once per worker, not per row: what signs its requests (rotation, routing.sql).
               pgmb.signing_secrets(wk.secret, wk.id, t)
        INTO bucket, breaker, secrets
        FROM pgmb_worker wk WHERE wk.id = w.id
        FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        tokens := least(floor(bucket)::integer, remaining);
        -- Circuit breaker (breakers.sql): open, nothing; after its cool-down, one delivery (the probe).
        IF breaker <> 'closed' THEN tokens := pgmb.breaker_admit(w.id, tokens, t, lease); END IF;
        taken := 0;
        -- Queue by queue, so each claim is an ordered scan of one queue's partial index.
        FOREACH q IN ARRAY w.queue_ids LOOP
            EXIT WHEN tokens <= 0;
            -- The pick, an ordered scan of this queue's part of pgmb_delivery_due; the rows
            -- picked are then found by primary key, whatever the planner thinks of the table.
            picked := ARRAY(
                SELECT d.id FROM pgmb_delivery d
                WHERE d.queue_id = q AND d.state = 'ready' AND d.available_at <= t
                ORDER BY d.priority, d.available_at, d.id
                LIMIT tokens
                FOR NO KEY UPDATE SKIP LOCKED);
            CONTINUE WHEN cardinality(picked) = 0;
            RETURN QUERY
            WITH leased AS (
                -- The attempt is counted now and handed back if the lease expires unstarted.
                UPDATE pgmb_delivery d
                SET state = 'leased', attempts = d.attempts + 1, lease_id = lease, started = false,
                    available_at = t + least(qu.lease_seconds, 2592000) * interval '1 second'
                FROM pgmb_queue qu
                WHERE d.id = ANY (picked) AND qu.id = d.queue_id
                RETURNING d.id, d.attempts, qu.max_retries, d.queue_id, qu.name,
                          d.message_id, qu.lease_seconds
            )
            SELECT l.id, lease, l.attempts, 1 + coalesce(m.max_retries, l.max_retries), l.queue_id,
                   l.name::text, m.id, m.routing_key::text, m.body::text, m.headers, m.created_at,
                   wk.id, wk.endpoint::text, wk.timeout, secrets, wk.rps, l.lease_seconds
            FROM unnest(picked) WITH ORDINALITY AS p(id, n)
            JOIN leased l ON l.id = p.id
            JOIN pgmb_message m ON m.id = l.message_id
            JOIN pgmb_worker wk ON wk.id = w.id
            -- In the order picked.
            ORDER BY p.n;
            GET DIAGNOSTICS got = ROW_COUNT;
            tokens := tokens - got;
            remaining := remaining - got;
            taken := taken + got;
        END LOOP;
        UPDATE pgmb_worker wk SET tokens = bucket - taken, tokens_at = t WHERE wk.id = w.id;
    END LOOP;
END $$;

-- Records successful attempts: the deliveries are deleted and their attempts written to the
-- history (outcome 'ack'); the circuit breakers hear of them first. Planned as pgmb.claim.
CREATE OR REPLACE FUNCTION pgmb.ack(delivery_ids bigint[], statuses integer[] DEFAULT NULL::integer[], durations_ms double precision[] DEFAULT NULL::double precision[]) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode = force_custom_plan SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
    AS $$
DECLARE
    acked integer;
BEGIN
    PERFORM pgmb.breaker_settle(delivery_ids, NULL, statuses, NULL, true);  -- circuit breakers (breakers.sql)
    WITH input AS (
        SELECT * FROM unnest(delivery_ids, statuses, durations_ms) AS u(id, status, duration_ms)
    ), done AS (
        DELETE FROM pgmb_delivery d USING input u WHERE d.id = u.id AND d.id = ANY (delivery_ids)
        RETURNING d.id, d.message_id, d.queue_id, d.attempts
    ), history AS (
        INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
        SELECT done.message_id, done.queue_id, done.attempts, 'ack', u.status, u.duration_ms, '', clock_timestamp()
        FROM done JOIN input u ON u.id = done.id
        RETURNING 1
    )
    SELECT count(*)::integer INTO acked FROM history;
    RETURN acked;
END $$;

DROP FUNCTION IF EXISTS pgmb.free_slots(uuid, integer, timestamptz), pgmb.slot_free_at(uuid, integer),
    pgmb.wake_for_slots(bigint[]);
DROP INDEX IF EXISTS pgmb_worker_capped;
ALTER TABLE pgmb_worker DROP CONSTRAINT IF EXISTS pgmb_worker_max_in_flight_positive;

-- ==== Fair shares per key ====

-- Dead letters back to their queue: attempts start again, due now, with the message's
-- priority, group and dependencies. A requeued delivery gets a new id: in its group it goes
-- behind the members already there (docs/ordering.md).
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

-- For each of `message_ids`, a new delivery on each queue that acked it (an attempt with
-- outcome 'ack'), only queues named in `queue_names` when given, with the message's
-- priority, group and dependencies. A queue where the message is live (a delivery) or dead
-- (a dead letter) right now is skipped: the unique (message, queue) constraints allow one of
-- each, and requeueing is for dead letters. Ids of purged messages, of unknown messages and
-- of deleted queues give nothing, nor does a message claimed by an archive run: the shared
-- lock waits for a claim batch in progress to commit; each statement of this function then
-- reads the database anew (READ COMMITTED), so a message is either claimed (and skipped
-- here) or has its new delivery before a claim looks at it (and is not claimed). Returns how
-- many deliveries were created.
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

DROP TRIGGER pgmb_delivery_fair_key ON pgmb_delivery;
DROP TRIGGER pgmb_queue_fair_keys ON pgmb_queue;
DROP FUNCTION pgmb.note_fair_key(), pgmb.forget_fair_keys(), pgmb.fair_queue_id(text),
    pgmb.fairness(text, text), pgmb.fair_key(text, text, integer, integer, double precision),
    pgmb.fair_pick(uuid, integer, timestamptz), pgmb.fair_next_due(uuid),
    pgmb.delivery_fair_key(text, jsonb);
DROP TABLE pgmb.fair_key;
DROP INDEX pgmb_delivery_fair;
ALTER TABLE pgmb_delivery DROP COLUMN fair_key;
ALTER TABLE pgmb_queue DROP COLUMN fairness_header;

-- ==== Expiry ====
-- 0.1.1's functions (pgmb.loop_reclaim is 0.2.0's: its section drops it). The columns, with
-- their constraints and index, and the triggers that call pgmb.refuse_expiry, are put back
-- by Django after this file, in the same transaction.

DROP FUNCTION IF EXISTS pgmb.send(uuid, text, jsonb, jsonb, timestamptz, float8, timestamptz, integer, text, uuid[], text, integer, float8),
    pgmb.expiry_problem(float8, timestamptz), pgmb.expire(integer);

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

DROP FUNCTION IF EXISTS pgmb.refuse_expiry(pgmb_message);

-- pgmb.read acts for its caller and keeps its planner settings (both are the function's
-- own, which CREATE OR REPLACE resets; pull.sql).
SELECT pgmb.pin_definers(ARRAY['pgmb.read(text, double precision, integer, jsonb)']);
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off;

-- Per worker, over the requests of its queues (not 'unsent' history rows: no request was
-- made): the last hour through the index on created_at, the last success through
-- pgmb_attempt_acked, the last error and the failures since the last success through a
-- look-back of at most 24 hours.
CREATE OR REPLACE FUNCTION pgmb.worker_metrics() RETURNS SETOF pgmb.worker_metrics
LANGUAGE sql STABLE AS $$
    SELECT w.name::text,
           w.active,
           coalesce(h.requests, 0),
           coalesce(h.successes, 0),
           h.successes::float8 / nullif(h.requests, 0),
           h.p95,
           s.at,
           e.status_code,
           e.error,
           e.created_at,
           coalesce(f.n, 0),
           now()
    FROM pgmb_worker w
    LEFT JOIN (
        SELECT q.worker_id,
               count(*) AS requests,
               count(*) FILTER (WHERE a.outcome = 'ack') AS successes,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY a.duration_ms) AS p95
        FROM pgmb_attempt a JOIN pgmb_queue q ON q.id = a.queue_id
        WHERE a.created_at > now() - interval '1 hour' AND a.outcome <> 'unsent'
        GROUP BY q.worker_id
    ) h ON h.worker_id = w.id
    LEFT JOIN LATERAL (
        SELECT max(a.created_at) AS at
        FROM pgmb_queue q
        CROSS JOIN LATERAL (
            SELECT a.created_at FROM pgmb_attempt a
            WHERE a.queue_id = q.id AND a.outcome = 'ack'
            ORDER BY a.created_at DESC LIMIT 1
        ) a
        WHERE q.worker_id = w.id
    ) s ON true
    LEFT JOIN LATERAL (
        SELECT a.status_code, a.error, a.created_at
        FROM pgmb_attempt a JOIN pgmb_queue q ON q.id = a.queue_id
        WHERE q.worker_id = w.id AND a.outcome NOT IN ('ack', 'unsent')
          AND a.created_at > now() - interval '24 hours'
        ORDER BY a.created_at DESC, a.id DESC LIMIT 1
    ) e ON true
    LEFT JOIN LATERAL (
        SELECT count(*) AS n
        FROM pgmb_attempt a JOIN pgmb_queue q ON q.id = a.queue_id
        WHERE q.worker_id = w.id AND a.outcome NOT IN ('ack', 'unsent')
          AND a.created_at > greatest(s.at, now() - interval '24 hours')
    ) f ON true
    ORDER BY w.name
$$;

-- Every queue's metrics, by name. An SQL function PostgreSQL inlines: a condition on
-- queue_name reaches the scan of pgmb_queue, and each queue's deliveries are read through
-- the partial index of its ready rows (pgmb_delivery_due); leased and waiting rows (few),
-- and the last hour's attempts, are read once for all queues. 'unsent' history rows (no
-- request was made) are not failures, and an archived message is neither delivered nor failed.
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

-- ==== Cancel and run now ====
-- 0.1.1's outcome writers (before the column they read is dropped), and no cancel or run now.

-- Give leased deliveries back unattempted (a dispatcher shutting down before it posted them).
CREATE OR REPLACE FUNCTION pgmb.release(delivery_ids bigint[], lease_ids uuid[])
RETURNS integer
LANGUAGE sql AS $$
    WITH released AS (
        UPDATE pgmb_delivery d
        SET state = 'ready', lease_id = NULL, attempts = greatest(d.attempts - 1, 0), available_at = now()
        FROM unnest(delivery_ids, lease_ids) AS u(id, lease_id)
        WHERE d.id = u.id AND d.lease_id = u.lease_id AND d.state = 'leased'
        RETURNING 1
    )
    SELECT count(*)::integer FROM released
$$;

-- Leases that ran out (a dispatcher died or hung). One whose request started counts as a
-- failed attempt ('expired'); one that never started is handed back with its attempt
-- ('unsent', due at once), except from a delivery's third such expiry on, which counts.
CREATE OR REPLACE FUNCTION pgmb.reclaim_expired(max_count integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    counted_ids bigint[];
    counted_leases uuid[];
    counted_errors text[];
    unsent_ids bigint[];
    unsent_lease_ids uuid[];
    returned integer := 0;
BEGIN
    SELECT array_agg(e.id) FILTER (WHERE e.counted),
           array_agg(e.lease_id) FILTER (WHERE e.counted),
           array_agg(CASE WHEN e.started THEN 'lease expired before an outcome was recorded'
                          ELSE format('lease expired before its request was marked started; counted, '
                                      'as %s earlier leases of this delivery expired so', e.unsent_leases)
                     END) FILTER (WHERE e.counted),
           array_agg(e.id) FILTER (WHERE NOT e.counted),
           array_agg(e.lease_id) FILTER (WHERE NOT e.counted)
    INTO counted_ids, counted_leases, counted_errors, unsent_ids, unsent_lease_ids
    -- At most 2 unsent leases are forgiven (docs/decisions/0006-leases-and-at-least-once.md).
    FROM (SELECT d.id, d.lease_id, d.started, d.unsent_leases,
                 d.started OR d.unsent_leases >= 2 AS counted
          FROM pgmb_delivery d
          WHERE d.state = 'leased' AND d.available_at <= clock_timestamp()
          ORDER BY d.available_at
          LIMIT max_count
          FOR UPDATE SKIP LOCKED) AS e;
    IF unsent_ids IS NOT NULL THEN
        WITH handed_back AS (
            UPDATE pgmb_delivery d
            SET state = 'ready', lease_id = NULL, attempts = greatest(d.attempts - 1, 0),
                unsent_leases = d.unsent_leases + 1, available_at = clock_timestamp()
            FROM unnest(unsent_ids, unsent_lease_ids) AS u(id, lease_id)
            WHERE d.id = u.id AND d.lease_id = u.lease_id AND d.state = 'leased'
            RETURNING d.message_id, d.queue_id, d.attempts + 1 AS attempt
        )
        INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms, error, created_at)
        SELECT h.message_id, h.queue_id, h.attempt, 'unsent', NULL, NULL,
               'lease expired before its request was marked started: the attempt is not counted',
               clock_timestamp()
        FROM handed_back h;
        GET DIAGNOSTICS returned = ROW_COUNT;
    END IF;
    IF counted_ids IS NULL THEN
        RETURN returned;
    END IF;
    RETURN returned + pgmb.settle_failures(counted_ids, counted_leases, NULL, counted_errors,
                                           NULL, NULL, 'expired');
END $$;

DROP FUNCTION IF EXISTS pgmb.cancel(text, text, interval), pgmb.cancel(bigint[]),
    pgmb.run_now(text, text, interval), pgmb.run_now(bigint[]),
    pgmb.matching_deliveries(text, text, interval), pgmb.canceled_in_flight();

-- ==== Operational events ====
-- 0.1.1's functions that publish no events, then what events.sql made goes.

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

SELECT pgmb.pin_definers(ARRAY['pgmb.nack(text, bigint[], integer[], text[])',
                               'pgmb.read(text, double precision, integer, jsonb)']);
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off;

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
END $$;

DROP FUNCTION pgmb.dead_letter_event(uuid, uuid, integer, integer, text),
    pgmb.delivery_event(text, uuid, uuid, jsonb), pgmb.publish_event(text, jsonb), pgmb.set_events(boolean), pgmb.events_enabled();
DROP TABLE pgmb.event_settings;

-- ==== Backfill and recover ====

DROP FUNCTION pgmb.recover(text, timestamptz, timestamptz, integer),
    pgmb.backfill(text, timestamptz, timestamptz, integer),
    pgmb.check_window(text, text, timestamptz, timestamptz, integer);

-- ==== Schedules ====
-- 0.1.1's pgmb.next_wakeup is put back by the section "A cap on requests in flight" above,
-- its pgmb.dispatch_loop by "In-database loop". The functions of schedules.sql are dropped
-- before the Django operation drops pgmb_schedule (those taking its row type depend on it).

DROP FUNCTION IF EXISTS pgmb.loop_fire_schedules();
DROP FUNCTION IF EXISTS pgmb.fire_schedules(integer);
DROP FUNCTION IF EXISTS pgmb.fire_due_schedules(integer);
DROP FUNCTION IF EXISTS pgmb.unschedule(text);
DROP FUNCTION IF EXISTS pgmb.resume_schedule(text);
DROP FUNCTION IF EXISTS pgmb.pause_schedule(text);
DROP FUNCTION IF EXISTS pgmb.schedule(text, text, jsonb, jsonb, text, interval, text, text, timestamptz, jsonb);
DROP FUNCTION IF EXISTS pgmb.schedule_message_id(bigint, timestamptz);
DROP FUNCTION IF EXISTS pgmb.schedule_after(pgmb_schedule, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS pgmb.cron_day_matches(date, integer[], integer[], boolean);
DROP FUNCTION IF EXISTS pgmb.cron_next(text, text, timestamptz);
DROP FUNCTION IF EXISTS pgmb.wall_instant(timestamp, text);
DROP FUNCTION IF EXISTS pgmb.check_time_zone(text);
DROP FUNCTION IF EXISTS pgmb.cron_fields(text);
DROP FUNCTION IF EXISTS pgmb.cron_field(text, text, integer);
DROP FUNCTION IF EXISTS pgmb.cron_number(text, text, integer);
DROP FUNCTION IF EXISTS pgmb.cron_refuse(text, text);


-- ==== Spans of the in-database loop's attempts ====
-- 0.1.1 had neither; pgmb.loop_record is 0.2.0's (dropped with the loop's named steps).
DROP TABLE IF EXISTS pgmb.trace_export;
ALTER TABLE pgmb_attempt DROP COLUMN IF EXISTS indb;
-- ==== Unique while live ====
-- 0.1.1's pgmb.admit_message is put back by the section "Expiry" above. The new functions
-- are dropped before the Django operations drop the columns, the index and the trigger.
DROP FUNCTION IF EXISTS pgmb.send_unique(uuid, text, jsonb, text, text, jsonb, timestamptz, float8, timestamptz, integer, text, integer, float8);
DROP FUNCTION IF EXISTS pgmb.unique_live(text, text);
DROP FUNCTION IF EXISTS pgmb.admit_unique_delivery(pgmb_delivery);
DROP FUNCTION IF EXISTS pgmb.admit_unique(pgmb_message);
DROP FUNCTION IF EXISTS pgmb.unique_key_problem(text, text);
-- The admit_unique_key trigger's function, which django-pgtrigger leaves behind (the trigger
-- itself is dropped by Django before this file runs).
DROP FUNCTION IF EXISTS pgtrigger_admit_unique_key_8e3e9();
