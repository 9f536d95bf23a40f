-- pgmb 0001: the SQL core as first released. A released migration file is never edited:
-- a change is a new numbered file (see docs/migrations.md).
--
-- Names, routing and binding keys; table defaults and checks; workers, queues and their
-- views; the seed's SQL API; the delivery state machine; in-database dispatch.

-- ==== routing ====

-- Names, routing keys and binding keys: the same rules as pgmb/routing.py, for producers
-- that reach the tables without Python. Errors carry SQLSTATE 42602 (invalid_name) or
-- 22023 (invalid_parameter_value) and a sentence a person can act on.

CREATE SCHEMA IF NOT EXISTS pgmb;

-- The stem of a queue's views: 'order_queue' and 'order' both give 'order'.
CREATE OR REPLACE FUNCTION pgmb.view_base(queue_name text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT regexp_replace(queue_name, '_queue$', '') $$;

CREATE OR REPLACE FUNCTION pgmb.check_name(kind text, name text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    base text;
BEGIN
    IF name IS NULL OR name !~ '^[a-z][a-z0-9_]{0,47}$' THEN
        RAISE EXCEPTION 'invalid % name %', kind, quote_nullable(name)
            USING ERRCODE = 'invalid_name',
                  HINT = 'Use 1 to 48 characters, lower-case letters, digits and underscores, starting with a letter.';
    END IF;
    IF kind = 'queue' THEN
        base := pgmb.view_base(name);
        IF base LIKE '%\_dead\_letter' THEN
            RAISE EXCEPTION 'invalid queue name %: a name may not end in ''_dead_letter''', quote_literal(name)
                USING ERRCODE = 'invalid_name',
                      HINT = 'Its views would clash with another queue''s dead-letter view.';
        END IF;
        IF length(base) > 63 - length('_dead_letter_queue') THEN
            RAISE EXCEPTION 'invalid queue name %: too long for its views', quote_literal(name)
                USING ERRCODE = 'invalid_name',
                      HINT = 'Without a trailing ''_queue'' a queue name may have at most 45 characters.';
        END IF;
    END IF;
    RETURN name;
END $$;

CREATE OR REPLACE FUNCTION pgmb.check_key(kind text, key text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF key IS NULL OR key = '' THEN
        RAISE EXCEPTION 'invalid %: it must be a non-empty string', kind
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF length(key) > 255 THEN
        RAISE EXCEPTION 'invalid %: longer than 255 characters', kind
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF key ~ '[[:space:][:cntrl:]]' THEN
        RAISE EXCEPTION 'invalid % %: blanks and control characters are not allowed', kind, quote_literal(key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN key;
END $$;

CREATE OR REPLACE FUNCTION pgmb.check_routing_key(routing_key text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    PERFORM pgmb.check_key('routing key', routing_key);
    IF routing_key ~ '[*#]' THEN
        RAISE EXCEPTION 'invalid routing key %: ''*'' and ''#'' are wildcards, only binding keys use them', quote_literal(routing_key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN routing_key;
END $$;

-- A binding key compiles to an anchored regex matched against '.' || routing_key: with a
-- dot before every word, '#' is "any number of dot-words" with no special case at the ends.
CREATE OR REPLACE FUNCTION pgmb.compile_binding(binding_key text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    word text;
    pattern text := '^';
BEGIN
    PERFORM pgmb.check_key('binding key', binding_key);
    FOREACH word IN ARRAY string_to_array(binding_key, '.') LOOP
        IF word = '#' THEN
            pattern := pattern || '(?:\.[^.]*)*';
        ELSIF word = '*' THEN
            pattern := pattern || '\.[^.]*';
        ELSIF word ~ '[*#]' THEN
            RAISE EXCEPTION 'invalid binding key %: wildcards must be whole words', quote_literal(binding_key)
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = format('Got %L; write ''a.*'' or ''a.#'', not ''a*''.', word);
        ELSE
            pattern := pattern || '\.' || regexp_replace(word, '([\\^$.|?*+()\[\]{}])', '\\\1', 'g');
        END IF;
    END LOOP;
    RETURN pattern || '$';
END $$;

-- Whether a binding key routes a routing key: for operators trying patterns in psql.
CREATE OR REPLACE FUNCTION pgmb.matches(binding_key text, routing_key text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ('.' || pgmb.check_routing_key(routing_key)) ~ pgmb.compile_binding(binding_key) $$;

-- ==== tables ====

-- What Django's models cannot declare portably: database defaults (so plain INSERTs from
-- any client work), CHECK constraints, and the index that keeps queue views unique.

ALTER TABLE pgmb_worker
    ALTER COLUMN id SET DEFAULT gen_random_uuid(),
    ALTER COLUMN timeout SET DEFAULT 10,
    ALTER COLUMN secret SET DEFAULT '',
    ALTER COLUMN active SET DEFAULT true,
    ALTER COLUMN created_at SET DEFAULT now(),
    ADD CONSTRAINT pgmb_worker_rps_positive CHECK (rps > 0),
    ADD CONSTRAINT pgmb_worker_timeout_positive CHECK (timeout > 0);

ALTER TABLE pgmb_queue
    ALTER COLUMN id SET DEFAULT gen_random_uuid(),
    ALTER COLUMN max_retries SET DEFAULT 5,
    ALTER COLUMN backoff_base SET DEFAULT 1,
    ALTER COLUMN backoff_max SET DEFAULT 300,
    ALTER COLUMN lease_seconds SET DEFAULT 60,
    ALTER COLUMN paused SET DEFAULT false,
    ALTER COLUMN created_at SET DEFAULT now(),
    ADD CONSTRAINT pgmb_queue_retries_not_negative CHECK (max_retries >= 0),
    ADD CONSTRAINT pgmb_queue_backoff_valid CHECK (backoff_base >= 0 AND backoff_max >= backoff_base),
    ADD CONSTRAINT pgmb_queue_lease_positive CHECK (lease_seconds > 0);

-- 'order' and 'order_queue' would both own the view pgmb.order_queue.
CREATE UNIQUE INDEX pgmb_queue_view_base ON pgmb_queue (pgmb.view_base(name));

ALTER TABLE pgmb_message
    ALTER COLUMN id SET DEFAULT gen_random_uuid(),
    ALTER COLUMN headers SET DEFAULT '{}',
    ALTER COLUMN created_at SET DEFAULT now(),
    ALTER COLUMN available_at SET DEFAULT now(),
    ADD CONSTRAINT pgmb_message_routing_key_valid
        CHECK (routing_key <> '' AND routing_key !~ '[*#[:space:][:cntrl:]]'),
    ADD CONSTRAINT pgmb_message_headers_object CHECK (jsonb_typeof(headers) = 'object');

ALTER TABLE pgmb_delivery
    ALTER COLUMN state SET DEFAULT 'ready',
    ALTER COLUMN attempts SET DEFAULT 0,
    ALTER COLUMN created_at SET DEFAULT now(),
    -- Written as the catalog prints it back, so that a dump of the schema loads unchanged.
    ADD CONSTRAINT pgmb_delivery_state_valid CHECK (state::text = ANY ('{ready,leased}'::text[]));

ALTER TABLE pgmb_dead_letter
    ALTER COLUMN last_error SET DEFAULT '',
    ALTER COLUMN created_at SET DEFAULT now();

ALTER TABLE pgmb_attempt
    ALTER COLUMN error SET DEFAULT '',
    ALTER COLUMN created_at SET DEFAULT now();

-- ==== catalog ====

-- Workers and queues: validation on every write (called by the BEFORE triggers that
-- pgmb.models declares), and the seed's per-queue views (called by the AFTER trigger).

CREATE OR REPLACE FUNCTION pgmb.prepare_worker(w pgmb_worker) RETURNS pgmb_worker
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmb.check_name('worker', w.name);
    IF w.endpoint IS NULL OR w.endpoint !~* '^https?://[^/?#[:space:]]+([/?#][^[:space:]]*)?$' THEN
        RAISE EXCEPTION 'invalid endpoint % for worker %', quote_nullable(w.endpoint), w.name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The endpoint must be an http:// or https:// URL.';
    END IF;
    IF w.rps IS NULL OR w.rps <= 0 THEN
        RAISE EXCEPTION 'invalid rps % for worker %: it must be at least 1 request per second', w.rps, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.timeout IS NULL OR w.timeout <= 0 THEN
        RAISE EXCEPTION 'invalid timeout % for worker %: it must be positive', w.timeout, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN w;
END $$;

CREATE OR REPLACE FUNCTION pgmb.prepare_queue(q pgmb_queue) RETURNS pgmb_queue
LANGUAGE plpgsql AS $$
DECLARE
    other text;
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
    RETURN q;
END $$;

CREATE OR REPLACE FUNCTION pgmb.create_queue_views(queue_id uuid, queue_name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    base text := pgmb.view_base(queue_name);
BEGIN
    EXECUTE format('CREATE OR REPLACE VIEW pgmb.%I AS SELECT * FROM pgmb.queue_entries WHERE queue_id = %L',
                   base || '_queue', queue_id);
    EXECUTE format('CREATE OR REPLACE VIEW pgmb.%I AS SELECT * FROM pgmb.dead_letter_entries WHERE queue_id = %L',
                   base || '_dead_letter_queue', queue_id);
END $$;

CREATE OR REPLACE FUNCTION pgmb.drop_queue_views(queue_name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    base text := pgmb.view_base(queue_name);
BEGIN
    EXECUTE format('DROP VIEW IF EXISTS pgmb.%I, pgmb.%I', base || '_queue', base || '_dead_letter_queue');
END $$;

-- Re-create every queue's views, after a migration changes the generic views they select from.
CREATE OR REPLACE FUNCTION pgmb.refresh_queue_views() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    q record;
    n integer := 0;
BEGIN
    FOR q IN SELECT id, name FROM pgmb_queue LOOP
        PERFORM pgmb.drop_queue_views(q.name);
        PERFORM pgmb.create_queue_views(q.id, q.name);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- ==== api ====

-- The SQL surface of the original pgmb extension, for producers that are not Django:
-- pgmb.worker, pgmb.create, the pgmb.send overloads and the monitoring views.

CREATE OR REPLACE FUNCTION pgmb.worker(name text, endpoint text, rps integer) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    new_id uuid;
BEGIN
    -- Checked before the INSERT so an over-long name gets this message, not a varchar error.
    PERFORM pgmb.check_name('worker', worker.name);
    IF EXISTS (SELECT 1 FROM pgmb_worker w WHERE w.name = worker.name) THEN
        RAISE EXCEPTION 'worker % already exists', quote_literal(worker.name)
            USING ERRCODE = 'unique_violation';
    END IF;
    INSERT INTO pgmb_worker (name, endpoint, rps) VALUES (worker.name, worker.endpoint, worker.rps)
    RETURNING id INTO new_id;
    RETURN new_id;
END $$;

-- The documented argument order: (name, binding_key, max_retries, worker_id).
CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, max_retries integer, worker_id uuid)
RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    new_id uuid;
BEGIN
    PERFORM pgmb.check_name('queue', $1);
    PERFORM pgmb.compile_binding($2);
    IF worker_id IS NULL OR NOT EXISTS (SELECT 1 FROM pgmb_worker w WHERE w.id = worker_id) THEN
        RAISE EXCEPTION 'unknown worker id %', coalesce(worker_id::text, 'NULL')
            USING ERRCODE = 'foreign_key_violation',
                  HINT = 'Register the worker first: SELECT pgmb.worker(name, endpoint, rps);';
    END IF;
    INSERT INTO pgmb_queue (name, binding_key, pattern, worker_id, max_retries)
    VALUES ($1, $2, '', $4, $3)  -- "create" is a keyword, so no create.name
    RETURNING id INTO new_id;
    RETURN new_id;
END $$;

-- The order the seed's Quick Start uses: (name, binding_key, worker_id, max_retries).
CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, worker_id uuid, max_retries integer)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT pgmb.create(name, binding_key, max_retries, worker_id) $$;

-- Every send returns the message id (the seed returned void; an id is strictly more useful).
CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb, delay timestamptz)
RETURNS uuid
LANGUAGE plpgsql AS $$
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION 'a message id is required' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass gen_random_uuid() for a new id.';
    END IF;
    PERFORM pgmb.check_routing_key(routing_key);
    IF body IS NULL THEN
        RAISE EXCEPTION 'a message body is required (JSON null is ''null''::jsonb)'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'message headers must be a JSON object, not %', jsonb_typeof(headers)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM pgmb_message m WHERE m.id = send.id) THEN
        RAISE EXCEPTION 'message % already exists', send.id
            USING ERRCODE = 'unique_violation',
                  HINT = 'Message ids are unique; pass gen_random_uuid() for a new message.';
    END IF;
    INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at)
    VALUES (send.id, send.routing_key, send.body, coalesce(send.headers, '{}'), now(),
            greatest(coalesce(send.delay, now()), now()));
    RETURN send.id;
END $$;

CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb, delay integer)
RETURNS uuid
LANGUAGE plpgsql AS $$
BEGIN
    IF delay < 0 THEN
        RAISE EXCEPTION 'invalid delay %: seconds must not be negative', delay
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN pgmb.send(id, routing_key, body, headers, now() + make_interval(secs => coalesce(delay, 0)));
END $$;

CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT pgmb.send(id, routing_key, body, headers, NULL::timestamptz) $$;

CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT pgmb.send(id, routing_key, body, NULL::jsonb, NULL::timestamptz) $$;

-- Monitoring views. Secrets are never shown.

CREATE OR REPLACE VIEW pgmb.workers AS
SELECT w.id, w.name, w.endpoint, w.rps, w.timeout, w.active, (w.secret <> '') AS signed, w.created_at
FROM pgmb_worker w;

CREATE OR REPLACE VIEW pgmb.queues AS
SELECT q.id, q.name, q.binding_key, q.pattern, q.worker_id, w.name AS worker, q.max_retries,
       q.backoff_base, q.backoff_max, q.lease_seconds, q.paused,
       (SELECT count(*) FROM pgmb_delivery d WHERE d.queue_id = q.id) AS pending,
       (SELECT count(*) FROM pgmb_dead_letter x WHERE x.queue_id = q.id) AS dead_letters,
       q.created_at
FROM pgmb_queue q JOIN pgmb_worker w ON w.id = q.worker_id;

CREATE OR REPLACE VIEW pgmb.messages AS
SELECT m.id, m.routing_key, m.body, m.headers, m.created_at, m.available_at,
       (EXISTS (SELECT 1 FROM pgmb_delivery d WHERE d.message_id = m.id)
        OR EXISTS (SELECT 1 FROM pgmb_dead_letter x WHERE x.message_id = m.id)
        OR EXISTS (SELECT 1 FROM pgmb_attempt a WHERE a.message_id = m.id)) AS routed
FROM pgmb_message m;

-- Everything a queue holds or held: live deliveries (acknoledge = false, the seed's
-- spelling, kept so its monitoring query works) and acknowledged ones from the history.
CREATE OR REPLACE VIEW pgmb.queue_entries AS
SELECT d.queue_id, q.name AS queue, d.message_id, m.routing_key, m.body, m.headers,
       CASE WHEN d.available_at <= now() THEN 'ready'
            WHEN d.state = 'leased' THEN 'leased'
            ELSE 'delayed' END AS state,
       false AS acknoledge, false AS acknowledged,
       d.attempts, d.available_at AS enqueued_at, m.created_at, NULL::timestamptz AS acknowledged_at
FROM pgmb_delivery d
JOIN pgmb_queue q ON q.id = d.queue_id
JOIN pgmb_message m ON m.id = d.message_id
UNION ALL
SELECT a.queue_id, q.name, a.message_id, m.routing_key, m.body, m.headers,
       'acked', true, true, a.attempt, NULL, m.created_at, a.created_at
FROM pgmb_attempt a
JOIN pgmb_queue q ON q.id = a.queue_id
JOIN pgmb_message m ON m.id = a.message_id
WHERE a.outcome = 'ack';

CREATE OR REPLACE VIEW pgmb.dead_letter_entries AS
SELECT x.queue_id, q.name AS queue, x.message_id, m.routing_key, m.body, m.headers,
       x.attempts, x.last_status, x.last_error, x.created_at AS dead_at, m.created_at
FROM pgmb_dead_letter x
JOIN pgmb_queue q ON q.id = x.queue_id
JOIN pgmb_message m ON m.id = x.message_id;

SELECT pgmb.refresh_queue_views();

-- ==== delivery ====

-- The delivery state machine: claim → (ack | fail → retry or dead letter), lease expiry,
-- requeue. Both dispatchers (the Python one and the in-database one) call these functions,
-- so each transition has exactly one implementation.
--
-- A delivery is 'ready' (due when available_at <= now) or 'leased' (until available_at).
-- `attempts` counts claims; a delivery gets 1 + max_retries of them, then it is dead.

-- Database defaults for the columns this migration adds (plain INSERTs rely on them).
ALTER TABLE pgmb_delivery ALTER COLUMN last_error SET DEFAULT '';
ALTER TABLE pgmb_worker ALTER COLUMN tokens SET DEFAULT 0;

-- Exponential backoff with "equal jitter": the delay for attempt n is within [d/2, d],
-- d = min(cap, base * 2^(n-1)). A Retry-After (seconds) lengthens it, up to a day.
CREATE OR REPLACE FUNCTION pgmb.retry_delay(attempt integer, base float8, cap float8, retry_after float8 DEFAULT NULL)
RETURNS float8
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT greatest(least(coalesce(retry_after, 0), 86400), d / 2 + random() * d / 2)
    FROM (SELECT least(cap, base * power(2, least(greatest(attempt, 1) - 1, 60))) AS d) AS backoff
$$;

-- What a claim hands a dispatcher: the delivery, its message, and where to post it.
DO $$ BEGIN
    CREATE TYPE pgmb.claimed AS (
        delivery_id bigint, lease_id uuid, attempt integer, queue_id uuid, queue text,
        message_id uuid, routing_key text, body text, headers jsonb, created_at timestamptz,
        worker_id uuid, endpoint text, timeout float8, secret text, rps integer,
        lease_seconds float8
    );
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- Claim up to max_count due deliveries of the named queues (NULL: all), leasing them.
-- Each worker's rps is a token bucket shared by every dispatcher: it refills at rps per
-- second up to rps * burst tokens, and a claim takes at most what is in it.
CREATE OR REPLACE FUNCTION pgmb.claim(queue_names text[], max_count integer, burst float8 DEFAULT 0.2)
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
        SET tokens = least(greatest(1, wk.rps * burst),
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
                RETURNING d.id, d.attempts, d.queue_id, qu.name, d.message_id, qu.lease_seconds
            )
            SELECT l.id, lease, l.attempts, l.queue_id, l.name::text, m.id, m.routing_key::text,
                   m.body::text, m.headers, m.created_at, wk.id, wk.endpoint::text, wk.timeout,
                   wk.secret::text, wk.rps, l.lease_seconds
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

-- Successful deliveries leave the hot table; their outcome goes to the history.
-- Acks are not fenced by lease: a 2xx means the endpoint has the message.
-- The hot functions below are PL/pgSQL although plain SQL would do: PL/pgSQL keeps their
-- plans for the session, where a LANGUAGE sql function with a FROM clause is planned
-- again on every call (measured: next_wakeup 1.1 ms as SQL, 0.1 ms planned once).
CREATE OR REPLACE FUNCTION pgmb.ack(delivery_ids bigint[], statuses integer[] DEFAULT NULL, durations_ms float8[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    acked integer;
BEGIN
    WITH input AS (
        SELECT * FROM unnest(delivery_ids, statuses, durations_ms) AS u(id, status, duration_ms)
    ), done AS (
        DELETE FROM pgmb_delivery d USING input u WHERE d.id = u.id
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

-- Failed attempts: retry after a backoff, or dead-letter once the attempts are used up.
-- Fenced by lease: a dispatcher whose lease ran out cannot reschedule someone else's claim.
CREATE OR REPLACE FUNCTION pgmb.settle_failures(
    delivery_ids bigint[], lease_ids uuid[], statuses integer[], errors text[],
    retry_after float8[], durations_ms float8[], retry_outcome text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    settled integer;
BEGIN
    WITH input AS (
        SELECT * FROM unnest(delivery_ids, lease_ids, statuses, errors, retry_after, durations_ms)
            AS u(id, lease_id, status, error, retry_after, duration_ms)
    ), target AS (
        SELECT d.id, d.message_id, d.queue_id, d.attempts, u.status, left(coalesce(u.error, ''), 2000) AS error,
               u.retry_after, u.duration_ms, d.attempts >= 1 + q.max_retries AS exhausted,
               q.backoff_base, q.backoff_max
        FROM input u
        JOIN pgmb_delivery d ON d.id = u.id AND d.lease_id = u.lease_id AND d.state = 'leased'
        JOIN pgmb_queue q ON q.id = d.queue_id
        FOR UPDATE OF d
    ), dead AS (
        DELETE FROM pgmb_delivery d USING target t WHERE d.id = t.id AND t.exhausted
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
                + pgmb.retry_delay(t.attempts, t.backoff_base, t.backoff_max, t.retry_after) * interval '1 second'
        FROM target t
        WHERE d.id = t.id AND NOT t.exhausted
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

CREATE OR REPLACE FUNCTION pgmb.fail(
    delivery_ids bigint[], lease_ids uuid[], statuses integer[] DEFAULT NULL, errors text[] DEFAULT NULL,
    retry_after float8[] DEFAULT NULL, durations_ms float8[] DEFAULT NULL)
RETURNS integer
LANGUAGE sql AS $$
    SELECT pgmb.settle_failures(delivery_ids, lease_ids, statuses, errors, retry_after, durations_ms, 'retry')
$$;

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

-- Whether a dispatcher running --until-idle still has work: anything due, leased, or
-- scheduled for a retry. Messages their producer delayed do not keep it running.
CREATE OR REPLACE FUNCTION pgmb.busy(queue_names text[])
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM pgmb_delivery d JOIN pgmb_queue qu ON qu.id = d.queue_id
        JOIN pgmb_worker wk ON wk.id = qu.worker_id
        WHERE (queue_names IS NULL OR qu.name = ANY (queue_names))
          AND NOT qu.paused AND wk.active
          AND (d.state = 'leased' OR d.attempts > 0 OR d.available_at <= clock_timestamp())
    )
$$;

-- Leases that ran out (a dispatcher died or hung): each counts as a failed attempt.
CREATE OR REPLACE FUNCTION pgmb.reclaim_expired(max_count integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    leases uuid[];
BEGIN
    SELECT array_agg(d.id), array_agg(d.lease_id) INTO ids, leases
    FROM (SELECT d.id, d.lease_id FROM pgmb_delivery d
          WHERE d.state = 'leased' AND d.available_at <= clock_timestamp()
          ORDER BY d.available_at
          LIMIT max_count
          FOR UPDATE SKIP LOCKED) AS d;
    IF ids IS NULL THEN
        RETURN 0;
    END IF;
    RETURN pgmb.settle_failures(ids, leases, NULL, array_fill('lease expired before an outcome was recorded'::text, ARRAY[cardinality(ids)]),
                                NULL, NULL, 'expired');
END $$;

-- Dead letters back to their queue: attempts start again, due now.
CREATE OR REPLACE FUNCTION pgmb.requeue(dead_letter_ids bigint[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    WITH moved AS (
        DELETE FROM pgmb_dead_letter x WHERE x.id = ANY (dead_letter_ids)
        RETURNING x.message_id, x.queue_id
    )
    INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at, created_at)
    SELECT message_id, queue_id, 'ready', 0, now(), now() FROM moved
    ON CONFLICT (message_id, queue_id) DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM pg_notify('pgmb', '');
    END IF;
    RETURN n;
END $$;

CREATE OR REPLACE FUNCTION pgmb.requeue(queue_name text)
RETURNS integer
LANGUAGE sql AS $$
    SELECT pgmb.requeue(array_agg(x.id))
    FROM pgmb_dead_letter x JOIN pgmb_queue q ON q.id = x.queue_id
    WHERE q.name = queue_name
$$;

-- Seconds until something may be claimable for these queues (NULL: nothing pending):
-- the next due delivery, the next token of a rate-limited worker, the next lease to expire.
-- PL/pgSQL for its kept plan, as pgmb.ack: the dispatchers ask this after most claims.
CREATE OR REPLACE FUNCTION pgmb.next_wakeup(queue_names text[])
RETURNS float8
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT CASE WHEN min(at) IS NOT NULL
                THEN greatest(0, extract(epoch FROM min(at) - clock_timestamp()))::float8 END
    FROM (
        SELECT CASE WHEN due IS NOT NULL
                    THEN greatest(due, tokens_at + (1 - least(tokens, 1)) / rps * interval '1 second')
               END AS at
        FROM (
            SELECT (SELECT min(d.available_at) FROM pgmb_delivery d
                    WHERE d.queue_id = qu.id AND d.state = 'ready') AS due,
                   wk.tokens, coalesce(wk.tokens_at, '-infinity') AS tokens_at, wk.rps
            FROM pgmb_queue qu JOIN pgmb_worker wk ON wk.id = qu.worker_id
            WHERE NOT qu.paused AND wk.active AND (queue_names IS NULL OR qu.name = ANY (queue_names))
        ) AS per_queue
        UNION ALL
        SELECT min(d.available_at) FROM pgmb_delivery d JOIN pgmb_queue qu ON qu.id = d.queue_id
        WHERE d.state = 'leased' AND (queue_names IS NULL OR qu.name = ANY (queue_names))
    ) AS candidates);
END $$;

-- ==== dispatch ====

-- In-database dispatch (the seed's design): a procedure that claims, POSTs through the
-- `http` extension (pgsql-http) or PL/Python, and records each outcome with a COMMIT of its
-- own; pg_cron runs it. Same claim/ack/fail functions and rate limits as pgmb_dispatch.

-- What one POST produced. status NULL: no HTTP answer (error says why).
DO $$ BEGIN
    CREATE TYPE pgmb.http_outcome AS (status integer, error text, retry_after float8, duration_ms float8);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- HMAC-SHA256 from core sha256() (RFC 2104), so signing needs no pgcrypto.
CREATE OR REPLACE FUNCTION pgmb.hmac_sha256(key bytea, data bytea) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    k bytea := CASE WHEN length(key) > 64 THEN sha256(key) ELSE key END;
    inner_pad bytea;
    outer_pad bytea;
BEGIN
    k := k || decode(repeat('00', 64 - length(k)), 'hex');
    inner_pad := k;
    outer_pad := k;
    FOR i IN 0..63 LOOP
        inner_pad := set_byte(inner_pad, i, get_byte(k, i) # 54);   -- 0x36
        outer_pad := set_byte(outer_pad, i, get_byte(k, i) # 92);   -- 0x5c
    END LOOP;
    RETURN sha256(outer_pad || sha256(inner_pad || data));
END $$;

-- The headers of one POST, as pgmb/dispatch/request.py builds them: the message's own
-- headers (printable ASCII values of valid names, none reserved), pgmb's, and a Standard
-- Webhooks signature when the worker has a secret.
CREATE OR REPLACE FUNCTION pgmb.request_headers(c pgmb.claimed, unix_time bigint) RETURNS jsonb
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

-- Seconds to wait from a Retry-After value (delta-seconds or an HTTP date).
CREATE OR REPLACE FUNCTION pgmb.retry_after_seconds(value text) RETURNS float8
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF value ~ '^\s*\d+\s*$' THEN
        RETURN trim(value)::float8;
    END IF;
    RETURN greatest(0, extract(epoch FROM value::timestamptz - now()));
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

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

-- Which transport the in-database path uses here: 'http', 'plpython3u' or NULL (none).
CREATE OR REPLACE FUNCTION pgmb.http_transport() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'http') THEN 'http'
        WHEN to_regprocedure('pgmb.post_via_plpython(text, text, jsonb, float8)') IS NOT NULL THEN 'plpython3u'
    END
$$;

CREATE OR REPLACE FUNCTION pgmb.post(url text, body text, headers jsonb, timeout float8)
RETURNS pgmb.http_outcome
LANGUAGE plpgsql AS $$
BEGIN
    CASE pgmb.http_transport()
        WHEN 'http' THEN RETURN pgmb.post_via_http(url, body, headers, timeout);
        WHEN 'plpython3u' THEN
            RETURN pgmb.post_via_plpython(url, body, headers, timeout);
        ELSE
            RAISE EXCEPTION 'pgmb: no HTTP transport in this database'
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Install the http extension (pgsql-http) or plpython3u, or run manage.py pgmb_dispatch instead.';
    END CASE;
END $$;

-- Whether the pg_cron dispatch job exists (a running loop ends when it is unscheduled).
CREATE OR REPLACE FUNCTION pgmb.cron_job_scheduled() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    found boolean;
BEGIN
    IF to_regclass('cron.job') IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT EXISTS (SELECT 1 FROM cron.job WHERE jobname = ''pgmb-dispatch'' AND active)' INTO found;
    RETURN found;
END $$;

-- Dispatch for `seconds`: claim a batch (COMMIT), POST each delivery and record its outcome
-- (COMMIT after each), so no row lock is held across a request and one failure never undoes
-- another's ack. Run by pg_cron; also CALLable by hand. Must be CALLed outside a transaction.
-- As a pg_cron job (as_job), it also stops as soon as its job is unscheduled.
CREATE OR REPLACE PROCEDURE pgmb.dispatch_loop(seconds float8 DEFAULT 55, batch integer DEFAULT 50,
                                               queue_names text[] DEFAULT NULL, burst float8 DEFAULT 0.2,
                                               as_job boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + seconds * interval '1 second';
    next_reclaim timestamptz := clock_timestamp();
    claimed pgmb.claimed[];
    c pgmb.claimed;
    outcome pgmb.http_outcome;
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
        SELECT array_agg(x) INTO claimed FROM pgmb.claim(queue_names, batch, burst) AS x;
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
            outcome := pgmb.post(c.endpoint, c.body,
                                 pgmb.request_headers(c, extract(epoch FROM now())::bigint), c.timeout);
            IF outcome.status BETWEEN 200 AND 299 THEN
                PERFORM pgmb.ack(ARRAY[c.delivery_id], ARRAY[outcome.status], ARRAY[outcome.duration_ms]);
            ELSE
                PERFORM pgmb.fail(ARRAY[c.delivery_id], ARRAY[c.lease_id], ARRAY[outcome.status],
                                  ARRAY[outcome.error], ARRAY[outcome.retry_after], ARRAY[outcome.duration_ms]);
            END IF;
            COMMIT;
        END LOOP;
    END LOOP;
END $$;

-- Housekeeping for the pg_cron path: expired leases, and pg_cron's own run log.
CREATE OR REPLACE FUNCTION pgmb.maintenance(keep interval DEFAULT '1 day') RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    reclaimed integer := pgmb.reclaim_expired(10000);
BEGIN
    IF to_regclass('cron.job_run_details') IS NOT NULL THEN
        EXECUTE 'DELETE FROM cron.job_run_details WHERE end_time < now() - $1' USING keep;
    END IF;
    RETURN reclaimed;
END $$;

-- pg_cron's version here as an array (e.g. {1,4}), NULL if pg_cron is not in this database.
CREATE OR REPLACE FUNCTION pgmb.cron_version() RETURNS integer[]
LANGUAGE sql STABLE AS $$
    SELECT string_to_array(substring(extversion FROM '^[0-9.]+'), '.')::integer[]
    FROM pg_extension WHERE extname = 'pg_cron'
$$;

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

CREATE OR REPLACE FUNCTION pgmb.cron_uninstall() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    removed integer := 0;
    job text;
BEGIN
    IF pgmb.cron_version() IS NULL THEN
        RETURN 0;
    END IF;
    FOR job IN EXECUTE 'SELECT jobname FROM cron.job WHERE jobname IN (''pgmb-dispatch'', ''pgmb-maintenance'')' LOOP
        EXECUTE 'SELECT cron.unschedule($1)' USING job;
        removed := removed + 1;
    END LOOP;
    RETURN removed;
END $$;
