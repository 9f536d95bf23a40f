-- What the pgmb_* tables hold beyond their Django models: database defaults for plain
-- INSERTs, checks, the routing tags column and the indexes and statistics that Django
-- cannot express. The trigger functions that keep a queue's or a worker's row consistent
-- are here too; the triggers themselves are declared on the models (django-pgtrigger).

-- Database defaults, so that producers writing rows in plain SQL need not name every
-- column; the checks hold for every writer.
ALTER TABLE pgmb_worker
    ALTER COLUMN id SET DEFAULT gen_random_uuid(),
    ALTER COLUMN secret SET DEFAULT '',
    ALTER COLUMN active SET DEFAULT true,
    ALTER COLUMN created_at SET DEFAULT now(),
    ALTER COLUMN tokens SET DEFAULT 0,
    ADD CONSTRAINT pgmb_worker_rps_positive CHECK (rps > 0),
    ADD CONSTRAINT pgmb_worker_timeout_positive CHECK (timeout > 0),
    ADD CONSTRAINT pgmb_worker_burst_positive CHECK (burst > 0),
    ADD CONSTRAINT pgmb_worker_max_in_flight_positive CHECK (max_in_flight >= 1),
    ADD CONSTRAINT pgmb_worker_breaker_state
        CHECK (breaker_state::text = ANY ('{closed,open,half_open}'::text[]));

-- A worker's retiring secrets (models.WorkerSecret): deleting the worker, by any writer,
-- takes them along; each one is a secret that can sign (pgmb.secret_problem).
ALTER TABLE pgmb_worker_secret
    ADD CONSTRAINT pgmb_worker_secret_worker FOREIGN KEY (worker_id) REFERENCES pgmb_worker (id)
        ON DELETE CASCADE,
    ADD CONSTRAINT pgmb_worker_secret_usable CHECK (secret <> '' AND pgmb.secret_problem(secret) IS NULL);

ALTER TABLE pgmb_queue
    ALTER COLUMN id SET DEFAULT gen_random_uuid(),
    ALTER COLUMN paused SET DEFAULT false,
    ALTER COLUMN created_at SET DEFAULT now(),
    ADD CONSTRAINT pgmb_queue_retries_not_negative CHECK (max_retries >= 0),
    ADD CONSTRAINT pgmb_queue_backoff_valid CHECK (backoff_base >= 0 AND backoff_max >= backoff_base),
    ADD CONSTRAINT pgmb_queue_lease_positive CHECK (lease_seconds > 0),
    -- A queue's lease and backoff are at most 30 days: no stored value stops a loop.
    ADD CONSTRAINT pgmb_queue_durations_bounded
        CHECK (lease_seconds <= 2592000 AND backoff_base <= 2592000 AND backoff_max <= 2592000),
    ADD CONSTRAINT pgmb_queue_dedup_window_valid
        CHECK (dedup_window >= 0 AND dedup_window <= 2592000),
    -- Only a pull queue may keep no history (pgmb.check_keep_history, Queue.clean).
    ADD CONSTRAINT pgmb_queue_history_pull_only CHECK (keep_history OR worker_id IS NULL);

-- Expiry (docs/delivery.md, Expiry): a queue's message_ttl, when set, is a positive number of
-- seconds and at most 30 days as its other durations; an expired delivery is dead-lettered
-- or dropped (pgmb.expire).
ALTER TABLE pgmb_queue
    ADD CONSTRAINT pgmb_queue_message_ttl_valid
        CHECK (message_ttl > 0 AND message_ttl <= 2592000),
    ADD CONSTRAINT pgmb_queue_on_expiry_valid
        CHECK (on_expiry::text = ANY ('{dead_letter,drop}'::text[]));

-- A queue's binding tags (pgmb.binding_tags of its binding key, kept by pgmb.prepare_queue):
-- the routing trigger takes to the regex only the queues whose tags are all tags of the key,
-- and with many queues finds them through this GIN index. fastupdate off: a new queue's
-- entries go straight into the index, so no publish pays for merging a pending list.
ALTER TABLE pgmb_queue ADD COLUMN IF NOT EXISTS binding_tags text[] NOT NULL DEFAULT '{}';
CREATE INDEX IF NOT EXISTS pgmb_queue_binding_tags ON pgmb_queue USING gin (binding_tags)
    WITH (fastupdate = off);
-- Which of the two the routing trigger uses is planned from pgmb_queue's statistics. By
-- default autovacuum analyzes a table after 50 changed rows, which a few queues never
-- reach: the planner would guess pages and rows and take the GIN index for five queues, a
-- tenth more for every publish (docs/decisions/0073-publishing-write-path.md). Analyzed
-- after any change (a page or a few: nothing to autovacuum), a few queues are scanned.
ALTER TABLE pgmb_queue SET (autovacuum_analyze_threshold = 0, autovacuum_analyze_scale_factor = 0);

ALTER TABLE pgmb_message
    ALTER COLUMN id SET DEFAULT pgmb.uuid_v7(),
    ALTER COLUMN headers SET DEFAULT '{}',
    ALTER COLUMN created_at SET DEFAULT now(),
    ALTER COLUMN available_at SET DEFAULT now(),
    ADD CONSTRAINT pgmb_message_headers_object CHECK (jsonb_typeof(headers) = 'object');

-- The role that published a message (pgmb.caller(), written out: a role that may INSERT
-- need not execute pgmb's functions). De-duplication and dependencies are scoped by it
-- (docs/decisions/0054-dedup-per-producing-role.md). Added without a default first, so that
-- adding it to a big table writes nothing: rows stored before 0.1.1 have none (NULL).
ALTER TABLE pgmb_message ADD COLUMN IF NOT EXISTS producer name;
ALTER TABLE pgmb_message
    ALTER COLUMN producer SET DEFAULT coalesce(nullif(current_setting('role'), 'none'), session_user)::name;

ALTER TABLE pgmb_delivery
    ALTER COLUMN state SET DEFAULT 'ready',
    ALTER COLUMN attempts SET DEFAULT 0,
    ALTER COLUMN last_error SET DEFAULT '',
    ALTER COLUMN created_at SET DEFAULT now(),
    -- Written as the catalog prints it back, so that a dump of the schema loads unchanged.
    ADD CONSTRAINT pgmb_delivery_state_valid CHECK (state::text = ANY ('{ready,leased,waiting}'::text[]));

ALTER TABLE pgmb_dead_letter
    ALTER COLUMN last_error SET DEFAULT '',
    ALTER COLUMN created_at SET DEFAULT now();

ALTER TABLE pgmb_attempt
    ALTER COLUMN error SET DEFAULT '',
    ALTER COLUMN created_at SET DEFAULT now();

-- Whether the in-database loop recorded the attempt (its outcome writer, pgmb.loop_record,
-- sets pgmb.indb_recording for the call): pgmb_trace_export makes spans of these, which no
-- dispatcher made (docs/tracing.md). A default, so that no writer of the history names it
-- (0.1.1's included) and an outcome costs one setting read. Not a Django field: nothing in
-- Python reads it but the exporter's SQL. Stable, not volatile: adding it rewrites no row.
ALTER TABLE pgmb_attempt
    ADD COLUMN IF NOT EXISTS indb boolean NOT NULL
        DEFAULT (coalesce(current_setting('pgmb.indb_recording', true), '') = 'on');

ALTER TABLE pgmb_statistics
    -- Immutable (AT TIME ZONE 'UTC', not the session's zone): an hour bucket is the same
    -- whatever the writer's time zone.
    ADD CONSTRAINT pgmb_statistics_whole_hour
        CHECK (date_trunc('hour', hour AT TIME ZONE 'UTC') = hour AT TIME ZONE 'UTC'),
    ADD CONSTRAINT pgmb_statistics_counts
        CHECK (delivered >= 0 AND failed >= 0 AND attempts = delivered + failed
               AND retried >= 0 AND dead_lettered >= 0 AND expired >= 0
               AND retried + dead_lettered + expired <= failed),
    ADD CONSTRAINT pgmb_statistics_top_errors_array CHECK (jsonb_typeof(top_errors) = 'array');

-- 'order' and 'order_queue' would both own the view pgmb.order_queue.
CREATE UNIQUE INDEX IF NOT EXISTS pgmb_queue_view_base ON pgmb_queue (pgmb.view_base(name));

-- A group's members in publish order (its head first); rows without a group are not in it.
CREATE INDEX IF NOT EXISTS pgmb_delivery_group ON pgmb_delivery (queue_id, group_key, id)
    WHERE group_key IS NOT NULL;

-- Deliveries that expire, by their expiry (pgmb.expire's sweep); rows without one, most,
-- are not in it and cost no publish anything.
CREATE INDEX IF NOT EXISTS pgmb_delivery_expiry ON pgmb_delivery (expires_at)
    WHERE expires_at IS NOT NULL;

-- Waiting deliveries by queue (the admin's queue filter); only waiting rows are in it.
CREATE INDEX IF NOT EXISTS pgmb_delivery_waiting ON pgmb_delivery (queue_id, id) WHERE state = 'waiting';

-- The waiting dependents of a message.
CREATE INDEX IF NOT EXISTS pgmb_delivery_depends_on ON pgmb_delivery USING gin (depends_on)
    WHERE depends_on IS NOT NULL;

-- Recent messages of a de-duplication id.
CREATE INDEX IF NOT EXISTS pgmb_message_dedup ON pgmb_message (dedup_id, created_at)
    WHERE dedup_id IS NOT NULL;

-- Workers with a breaker: outcome writers look here first and, with none, do nothing else.
CREATE INDEX IF NOT EXISTS pgmb_worker_breaker ON pgmb_worker (id)
    WHERE breaker_failures > 0 OR breaker_rate IS NOT NULL;

-- Capped workers (max_in_flight): an outcome writer looks here first and, with none, does
-- nothing more for the cap (pgmb.wake_for_slots).
CREATE INDEX IF NOT EXISTS pgmb_worker_capped ON pgmb_worker (id) WHERE max_in_flight IS NOT NULL;

-- An acknowledgement has a 2xx status, a failure has not: without the joint statistics
-- the planner multiplies the two conditions of "5xx failures" as if they were unrelated,
-- expects a tenth of the rows and counts them (or plans for a few) where there are many.
-- (In schema pgmb, with pgmb's other objects that are not Django's.)
CREATE STATISTICS IF NOT EXISTS pgmb.attempt_outcome_status (mcv)
    ON outcome, status_code FROM pgmb_attempt;

-- ==== the trigger functions of pgmb_worker and pgmb_queue ====

-- A worker's answers that stop retries (docs/delivery.md, Answers that stop retries): the
-- rules of pgmb.final_answers in Python (one table of cases runs both, tests/rules).
-- An entry of dead_statuses is a status (100 to 599, not a 2xx: that is a success) or a
-- class of them (1xx, 3xx, 4xx, 5xx); one of retried_statuses a status only. What is wrong
-- with a list (NULL: nothing), the first bad entry named.
CREATE OR REPLACE FUNCTION pgmb.statuses_problem(entries text[], classes boolean) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN entries IS NULL THEN 'a list is required (empty: none)'
           -- Quoted as pgmb.final_answers quotes it (no E'' form for a backslash).
           ELSE (SELECT coalesce('''' || replace(u.e, '''', '''''') || '''', 'NULL') || ' is not '
                        || CASE WHEN classes
                                THEN 'an HTTP status (100 to 599, not 2xx) or a class of them (1xx, 3xx, 4xx or 5xx)'
                                ELSE 'an HTTP status (100 to 599, not 2xx)' END
                 FROM unnest(entries) WITH ORDINALITY AS u(e, n)
                 WHERE NOT coalesce(lower(btrim(u.e, E' \t'))
                                    ~ CASE WHEN classes THEN '^(?:[1345][0-9][0-9]|[1345]xx)$'
                                           ELSE '^[1345][0-9][0-9]$' END, false)
                 ORDER BY u.n LIMIT 1) END
$$;

-- A valid list as stored: each entry trimmed and lower-cased, once, in byte order.
CREATE OR REPLACE FUNCTION pgmb.statuses_normalised(entries text[]) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(DISTINCT lower(btrim(u.e, E' \t')) COLLATE "C"
                              ORDER BY lower(btrim(u.e, E' \t')) COLLATE "C"), '{}')
    FROM unnest(entries) AS u(e)
$$;

-- Both lists of a worker checked and stored normalised, or refused naming what is wrong: a
-- status in both lists is refused (which would win is not for pgmb to guess).
CREATE OR REPLACE FUNCTION pgmb.check_final_answers(w public.pgmb_worker) RETURNS public.pgmb_worker
LANGUAGE plpgsql AS $$
DECLARE
    problem text;
    twice text;
BEGIN
    problem := pgmb.statuses_problem(w.dead_statuses, true);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid dead_statuses for worker %: %', w.name, problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'List statuses such as 410 or classes such as 4xx; an empty list retries every failure.';
    END IF;
    problem := pgmb.statuses_problem(w.retried_statuses, false);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid retried_statuses for worker %: %', w.name, problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'List statuses such as 408 or 429 that dead_statuses names the class of.';
    END IF;
    w.dead_statuses := pgmb.statuses_normalised(w.dead_statuses);
    w.retried_statuses := pgmb.statuses_normalised(w.retried_statuses);
    twice := (SELECT min(s) FROM unnest(w.retried_statuses) AS s WHERE s = ANY (w.dead_statuses));
    IF twice IS NOT NULL THEN
        RAISE EXCEPTION 'invalid retried_statuses for worker %: % is in dead_statuses too', w.name, twice
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN w;
END $$;

-- The header by which a worker asks that a failed delivery be dead-lettered at once, and
-- its value (compared trimmed of blanks, in any case): Pgmb-Delivery: abort. A transport
-- that reads it on a non-2xx answer begins the attempt's error with pgmb.aborted_prefix().
-- Named once here and in pgmb.final_answers (tests/rules/test_loop_constants.py).
CREATE OR REPLACE FUNCTION pgmb.abort_header() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 'pgmb-delivery' $$;

-- The header's value that asks for it.
CREATE OR REPLACE FUNCTION pgmb.abort_value() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 'abort' $$;

-- pgmb writes this; no worker can: a worker's answer reaches the error only after "HTTP ".
CREATE OR REPLACE FUNCTION pgmb.aborted_prefix() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 'the worker answered Pgmb-Delivery: abort, so it is dead-lettered at once: '
$$;

-- Whether a failed attempt's answer ends its delivery at once (pgmb.settle_failures), and
-- the note that the dead letter's error then begins with ('' when the error says why
-- already); NULL: retried as usual. Either the worker answered with the abort header
-- (its transport then began the error with pgmb.aborted_prefix()), or with a status of its
-- dead_statuses, named there or by its class, and not in its retried_statuses. An answer
-- with no status (a timeout, a refused connection) never stops retries. Inlined into the
-- statement that calls it (it calls nothing that is not IMMUTABLE, so no format()): a
-- call of its own would cost pgmb.settle_failures a quarter more CPU.
CREATE OR REPLACE FUNCTION pgmb.final_answer_note(status integer, error text, dead text[], retried text[])
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN status IS NULL THEN NULL
                WHEN starts_with(coalesce(error, ''), pgmb.aborted_prefix()) THEN ''
                WHEN dead = '{}' THEN NULL
                WHEN status::text = ANY (dead)
                     OR ((status / 100)::text || 'xx' = ANY (dead) AND NOT status::text = ANY (retried))
                THEN 'the worker answered ' || status::text || ', which it dead-letters at once: '
           END
$$;

-- The function of pgmb_worker's BEFORE INSERT trigger and of its BEFORE UPDATE OF every
-- column but the token bucket's (models.WORKER_RULED_COLUMNS; a claim's refill of the
-- bucket runs no rule): the name, endpoint, rate, timeout, cap on requests in flight and
-- secret rules for every writer (an unchanged endpoint or secret stays accepted: a row
-- stored before a rule can still be paused), then the circuit breaker's settings
-- (pgmb.check_breaker) and the answers that stop retries (pgmb.check_final_answers).
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
    IF w.max_in_flight < 1 THEN
        RAISE EXCEPTION 'invalid max_in_flight % for worker %: it must be at least 1 request in flight',
                        w.max_in_flight, w.name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'NULL (the default) sets no cap.';
    END IF;
    problem := pgmb.new_secret_problem(w.secret);
    IF problem IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM pgmb_worker o WHERE o.id = w.id AND o.secret = w.secret) THEN
        RAISE EXCEPTION 'invalid secret for worker %: %', w.name, problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use whsec_ and the base64 of at least 16 bytes (padded or not), or a text of at least 16 bytes without control characters.';
    END IF;
    w := pgmb.check_breaker(w);
    w := pgmb.check_final_answers(w);
    RETURN w;
END $_$;

-- Whether a worker's request timeout ends within a queue's lease: strictly shorter, so
-- that a request ends before its delivery can be claimed and posted again (NaN, greatest
-- of all here, ends within nothing). The rule of pgmb.models.timeout_within_lease
-- (tests/rules, one table of cases for both).
CREATE OR REPLACE FUNCTION pgmb.timeout_within_lease(timeout double precision, lease double precision)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT coalesce(timeout < lease, false) $$;

-- The worker_timeout trigger (a changed timeout): the new timeout ends within the lease of
-- every queue the worker delivers for, or the update is refused naming the shortest one.
-- The worker's row is locked by then (a BEFORE UPDATE trigger), and a queue's change of its
-- lease locks it FOR SHARE (pgmb.prepare_queue): the two take turns, and the later one
-- reads the earlier one's commit (a new snapshot for this statement).
CREATE OR REPLACE FUNCTION pgmb.check_worker_timeout(w public.pgmb_worker) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    queue text;
    lease double precision;
BEGIN
    SELECT q.name, q.lease_seconds INTO queue, lease FROM pgmb_queue q
    WHERE q.worker_id = w.id AND NOT pgmb.timeout_within_lease(w.timeout, q.lease_seconds)
    ORDER BY q.lease_seconds, q.name LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'invalid timeout % s for worker %: it must be shorter than the lease of queue % (% s)',
                        w.timeout, quote_literal(w.name), quote_literal(queue), lease
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A request that outlasts its lease is posted twice: shorten the timeout or lengthen the lease.';
    END IF;
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

-- Who may plant objects where pgmb's definers look (access.sql): the roles other than
-- pgmb's owner (and superusers) that may create objects in the tables' schema or in pgmb. Such a role could plant an operator or function of the exact
-- argument types a definer's body uses (say public.=(varchar, text)), which PostgreSQL
-- prefers to pg_catalog's coercing one wherever it sits in the search_path, and run its code
-- as the owner (docs/decisions/0026-definers-refuse-writable-schemas.md). Written with exact
-- types and qualified names only, because it runs inside the definers it protects.
CREATE OR REPLACE FUNCTION pgmb.schema_writers() RETURNS TABLE (schema_name name, grantee name)
LANGUAGE sql STABLE AS $$
    SELECT n.nspname,
           CASE WHEN a.grantee = 0::oid THEN 'PUBLIC'::name ELSE pg_catalog.pg_get_userbyid(a.grantee) END
    FROM pg_catalog.pg_class t
    JOIN pg_catalog.pg_namespace n
      ON n.oid = ANY (ARRAY[t.relnamespace,
                            (SELECT s.oid FROM pg_catalog.pg_namespace s WHERE s.nspname = 'pgmb'::name)])
    CROSS JOIN LATERAL pg_catalog.aclexplode(n.nspacl) a
    WHERE t.oid = pg_catalog.to_regclass('pgmb_message')::oid
      AND a.privilege_type = 'CREATE'::text
      AND a.grantee <> n.nspowner AND a.grantee <> t.relowner
      AND NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid = a.grantee AND r.rolsuper)
$$;

-- Raises insufficient_privilege while pgmb.schema_writers() names anyone: the first thing
-- every SECURITY DEFINER entry point does (itself, or through pgmb.may_publish, pgmb.may,
-- pgmb.require or pgmb.pull_queue), before any statement a planted operator could match.
-- Returns true otherwise.
CREATE OR REPLACE FUNCTION pgmb.refuse_writable_schemas() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    writers text;
    fix text;
BEGIN
    -- The common case, on every definer call, without building the message.
    IF NOT EXISTS (SELECT FROM pgmb.schema_writers()) THEN
        RETURN true;
    END IF;
    SELECT pg_catalog.string_agg(pg_catalog.format('%I (CREATE granted to %s)', w.schema_name,
                                                   CASE WHEN w.grantee = 'PUBLIC'::name THEN 'PUBLIC'::text
                                                        ELSE pg_catalog.quote_ident(w.grantee::text) END), ', '),
           pg_catalog.string_agg(pg_catalog.format('REVOKE CREATE ON SCHEMA %I FROM %s;', w.schema_name,
                                                   CASE WHEN w.grantee = 'PUBLIC'::name THEN 'PUBLIC'::text
                                                        ELSE pg_catalog.quote_ident(w.grantee::text) END), ' ')
    INTO writers, fix
    FROM pgmb.schema_writers() w;
    IF writers IS NOT NULL THEN
        RAISE EXCEPTION 'pgmb refuses to act for its callers while other roles may create objects in its schemas: %', writers
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'As the schema''s owner or a superuser: ' || fix || ' (docs/security.md)';
    END IF;
    RETURN true;  -- the writers went away meanwhile
END $$;

-- Makes each of these functions (regprocedure texts) act for its caller as pgmb's owner:
-- SECURITY DEFINER with search_path pg_catalog first, so that no object of the tables'
-- schema can stand in for a built-in of the same argument types; then the tables' schema
-- (the schema Django created them in, which pgmb.refuse_writable_schemas keeps closed to
-- other roles); pg_temp last, so no temporary object can stand in for one
-- (docs/decisions/0026-definers-refuse-writable-schemas.md). CREATE OR REPLACE drops these
-- settings: each schema file that defines entry points calls this after them.
CREATE OR REPLACE FUNCTION pgmb.pin_definers(signatures text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    tables name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE c.oid = 'pgmb_message'::regclass);
    f text;
BEGIN
    FOREACH f IN ARRAY signatures LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, %I, pg_temp',
                       f::regprocedure, tables);
    END LOOP;
END $$;
