-- What migration 0001_initial runs: a frozen copy of the files of pgmb/sql/schema/
-- that pgmb.sql.SCHEMA names, in its order.
-- Written by `make schema` until its release is cut, never edited after: read and
-- change pgmb/sql/schema/, and put a released schema's changes in the next
-- release's migration (docs/decisions/0023-one-migration-per-release.md).

-- ==== pgmb/sql/schema/types.sql ====
-- Schema pgmb and the composite types its functions exchange. Django owns the pgmb_* tables
-- (pgmb/models.py); everything of pgmb's that Django does not declare lives in schema pgmb,
-- or, for the tables, in tables.sql.

CREATE SCHEMA IF NOT EXISTS pgmb;

-- What a claim hands a dispatcher: the delivery, its message, and where to post it.
-- max_attempts (1 + the queue's max_retries): a failure of that attempt dead-letters.
-- secrets: those that sign the request (pgmb.signing_secrets), current first; empty: unsigned.
CREATE TYPE pgmb.claimed AS (
    delivery_id bigint, lease_id uuid, attempt integer, max_attempts integer, queue_id uuid,
    queue text, message_id uuid, routing_key text, body text, headers jsonb,
    created_at timestamptz, worker_id uuid, endpoint text, timeout float8, secrets text[],
    rps integer, lease_seconds float8
);

-- What one POST produced. status NULL: no HTTP answer (error says why).
CREATE TYPE pgmb.http_outcome AS (status integer, error text, retry_after float8, duration_ms float8);

-- One row of pgmb.metrics(): a queue's figures at scrape_time.
CREATE TYPE pgmb.queue_metrics AS (
    queue_name text,
    queue_length bigint,          -- live deliveries: ready, delayed and leased
    queue_visible_length bigint,  -- ready and due now
    newest_msg_age_sec float8,    -- since the newest live delivery was published (NULL: none)
    oldest_msg_age_sec float8,    -- since the oldest due one was published (NULL: none due)
    total_messages bigint,        -- deliveries the queue ever had: live + dead + acked
    leased bigint,
    retrying bigint,              -- attempts > 0, not leased
    dead_letters bigint,
    delivered_last_hour bigint,   -- acknowledged attempts in the last hour
    failed_last_hour bigint,      -- failed attempts (retry, dead, expired) in the last hour
    paused boolean,
    scrape_time timestamptz
);

-- One row of pgmb.worker_metrics(): a worker's last hour (and last day of failures).
CREATE TYPE pgmb.worker_metrics AS (
    worker_name text,
    active boolean,
    requests_last_hour bigint,
    successes_last_hour bigint,
    success_rate float8,          -- successes / requests of the last hour (NULL: no request)
    p95_latency_ms float8,        -- over the last hour's attempts with a duration
    last_success_at timestamptz,
    last_error_status integer,
    last_error text,
    last_error_at timestamptz,    -- the newest failure of the last 24 hours
    consecutive_failures bigint,  -- failures since the last success, within 24 hours
    scrape_time timestamptz
);

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

-- ==== pgmb/sql/schema/routing.sql ====
-- Names, routing keys and binding keys: the same rules as pgmb/routing.py, for producers
-- that reach the tables without Python. Errors carry SQLSTATE 42602 (invalid_name) or
-- 22023 (invalid_parameter_value) and a sentence a person can act on. Also the shared
-- rules of delays, secrets and retries, and time-ordered message ids.

-- The stem of a queue's views: 'order_queue' and 'order' both give 'order'.
CREATE OR REPLACE FUNCTION pgmb.view_base(queue_name text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT regexp_replace(queue_name, '_queue$', '') $$;

-- Checks a worker's or queue's name (kind 'worker' or 'queue') against the naming rule of
-- pgmb/routing.py and returns it; a queue's name must also leave room for its views.
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

-- Checks a routing key (no wildcards) and returns it; raises an error a person can act on.
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

-- Checks a routing or binding key (kind names which, for the message): non-empty, at most
-- 255 characters, no blanks or control characters. Returns the key.
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
    IF NOT pgmb.valid_key(key) THEN
        RAISE EXCEPTION 'invalid % %: blanks and control characters are not allowed', kind, quote_literal(key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN key;
END $$;

-- A delay in seconds: finite, not negative, and ending before the year 10000 counted from
-- now() (pgmb.durations.check_seconds). Returns the delay; NULL stays NULL (no delay).
CREATE OR REPLACE FUNCTION pgmb.check_delay(seconds float8) RETURNS float8
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE AS $$
BEGIN
    IF seconds = 'NaN'::float8 OR seconds IN ('Infinity'::float8, '-Infinity'::float8) THEN
        RAISE EXCEPTION 'invalid delay %: it must be a finite number of seconds', seconds
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF seconds < 0 THEN
        RAISE EXCEPTION 'invalid delay %: seconds must not be negative', seconds
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF seconds >= extract(epoch FROM timestamptz '10000-01-01 00:00:00+00' - now())::float8 THEN
        RAISE EXCEPTION 'invalid delay %: too long (past the year 9999)', seconds
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN seconds;
END $$;

-- What breaks the secret rule (pgmb/worker_request.py says it in words), or NULL when the
-- secret is usable: empty (unsigned); 'whsec_' then standard base64 with at most two '='
-- whose data part has a length that is not 4n+1 and decodes to at least one byte; or any
-- other text without control characters (a raw secret). Never quotes the secret.
CREATE OR REPLACE FUNCTION pgmb.secret_problem(secret text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    data text;
BEGIN
    IF secret = '' THEN
        RETURN NULL;
    END IF;
    IF starts_with(secret, 'whsec_') THEN
        data := substring(secret FROM '^whsec_([A-Za-z0-9+/]*)={0,2}$');
        IF data IS NULL THEN
            RETURN 'after ''whsec_'' comes standard base64 (A-Z, a-z, 0-9, + and /) with at most two ''='' at the end';
        ELSIF length(data) % 4 = 1 THEN
            RETURN 'the base64 after ''whsec_'' is cut short (4n+1 characters encode no bytes)';
        ELSIF data = '' THEN
            RETURN '''whsec_'' must be followed by the base64 of at least one byte';
        END IF;
        RETURN NULL;
    END IF;
    IF secret ~ '[\u0000-\u001f\u007f-\u009f]' THEN
        RETURN 'a secret may not contain control characters';
    END IF;
    RETURN NULL;
END $$;

-- The HMAC key of a secret: the bytes of a 'whsec_' secret's base64, decoded as the
-- Standard Webhooks libraries do (padding added as needed), or a raw secret's UTF-8 bytes.
-- A secret that breaks the rule raises 22023 (invalid_parameter_value).
CREATE OR REPLACE FUNCTION pgmb.secret_key(secret text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    problem text := pgmb.secret_problem(secret);
    data text;
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid worker secret: %', problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Give the worker a new secret: whsec_ and base64, or a text without control characters.';
    END IF;
    IF starts_with(secret, 'whsec_') THEN
        data := rtrim(substr(secret, 7), '=');
        RETURN decode(data || repeat('=', (4 - length(data) % 4) % 4), 'base64');
    END IF;
    RETURN convert_to(secret, 'UTF8');
END $$;

-- Rotation (docs/delivery.md, docs/decisions/0038-secret-rotation.md). A worker's secret
-- replaced by any writer keeps signing, as a retiring secret in pgmb_worker_secret, for
-- this long, unless its expiry is changed or it is revoked (its row deleted). The default
-- overlap's one home.
CREATE OR REPLACE FUNCTION pgmb.secret_overlap() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT interval '24 hours'
$$;

-- The secrets that sign a worker's requests at time `at`, the one rule for every signing
-- path (the claim hands them to the external dispatcher and the in-database transports;
-- the admin's test request asks here): its secret `current` unless empty, then its retiring
-- secrets that have not expired, the most recently retired first. An empty array: the
-- requests are not signed.
CREATE OR REPLACE FUNCTION pgmb.signing_secrets(current text, worker_id uuid, at timestamptz)
RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT array_remove(ARRAY[current], '') || ARRAY(
        SELECT s.secret::text FROM pgmb_worker_secret s
        WHERE s.worker_id = signing_secrets.worker_id AND s.expires_at > at
        ORDER BY s.retired_at DESC, s.id DESC)
$$;

-- The worker trigger's part of rotation (models.Worker's worker_retire_secret, on an
-- UPDATE that changes the secret): the old secret, unless empty or broken (one stored
-- before the rule, which could not sign), retires for pgmb.secret_overlap(); a secret
-- that becomes current again stops retiring; the worker's expired ones are removed.
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
$$;

-- Removes the retiring secrets that have expired (they sign nothing any more): called by
-- pgmb.maintenance() and the dispatcher's housekeeping. Returns how many.
CREATE OR REPLACE FUNCTION pgmb.forget_expired_secrets() RETURNS integer
LANGUAGE sql AS $$
    WITH gone AS (DELETE FROM pgmb_worker_secret s WHERE s.expires_at <= now() RETURNING 1)
    SELECT count(*)::integer FROM gone
$$;

-- Seconds to wait from a Retry-After value, never negative, or NULL for anything else
-- (never an error). The rule and its regex are pgmb.dispatch.client.RETRY_AFTER_PATTERN:
-- blanks (space, tab) around delta-seconds (ASCII digits) or an IMF-fixdate HTTP-date.
CREATE OR REPLACE FUNCTION pgmb.retry_after_seconds(value text) RETURNS float8
LANGUAGE plpgsql STABLE AS $$
DECLARE
    m text[] := regexp_match(value, '^[ \t]*(?:([0-9]+)|(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), ([0-9]{2}) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) ([0-9]{4}) ([01][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9]) GMT)[ \t]*$');
BEGIN
    IF m IS NULL THEN
        RETURN NULL;
    ELSIF m[1] IS NOT NULL THEN
        RETURN m[1]::float8;  -- too large for a float8: NULL, below
    END IF;
    RETURN greatest(0, extract(epoch FROM make_timestamptz(
        m[4]::integer,
        array_position('{Jan,Feb,Mar,Apr,May,Jun,Jul,Aug,Sep,Oct,Nov,Dec}'::text[], m[3]),
        m[2]::integer, m[5]::integer, m[6]::integer, m[7]::float8, 'UTC') - now()))::float8;
EXCEPTION WHEN data_exception THEN  -- a day that does not exist (31 Feb, year 0), an overflow
    RETURN NULL;
END $$;

-- Seconds before retry number `attempts`: exponential backoff from `base`, capped at `cap`,
-- or the endpoint's Retry-After when that is longer (bounded to a day).
CREATE OR REPLACE FUNCTION pgmb.retry_delay(attempt integer, base float8, cap float8, retry_after float8 DEFAULT NULL)
RETURNS float8
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT greatest(least(coalesce(retry_after, 0), 86400), d / 2 + random() * d / 2)
    FROM (SELECT least(cap, base * power(2, least(greatest(attempt, 1) - 1, 60)), 2592000) AS d) AS backoff
$$;

-- gen_random_uuid() gives 122 random bits with version 4 (0100) and the RFC variant; the
-- first 6 bytes become the time, and bits 52 and 53 (set_bit counts from each byte's low
-- bit) turn the version nibble from 0100 into 0111.
CREATE OR REPLACE FUNCTION pgmb.uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

-- Whether a key is non-empty, at most 255 characters and free of blanks and control
-- characters. Not STRICT, so that PostgreSQL inlines it (a STRICT SQL function is inlined
-- only if its body is strict, and one with AND is not); NULL gives NULL all the same.
CREATE OR REPLACE FUNCTION pgmb.valid_key(key text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT key <> '' AND length(key) <= 255
             AND key !~ '[\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]' $$;

-- Whether a routing key passes pgmb.valid_key and has no wildcard (* or #). Inlined like
-- pgmb.valid_key: the routing trigger and the key's UPDATE trigger test every message with it.
CREATE OR REPLACE FUNCTION pgmb.valid_routing_key(routing_key text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT pgmb.valid_key(routing_key) AND routing_key !~ '[*#]' $$;

-- The tags of a binding key (see above). Run only when a queue is written.
CREATE OR REPLACE FUNCTION pgmb.binding_tags(binding_key text) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(CASE
               WHEN NOT '#' = ANY (words[:i - 1]) AND i <= 4 THEN i || '.' || word
               WHEN NOT '#' = ANY (words[i + 1:]) AND cardinality(words) - i + 1 <= 4
                   THEN '-' || (cardinality(words) - i + 1) || '.' || word
               ELSE word END ORDER BY i), '{}')
    FROM string_to_array(binding_key, '.') AS words,
         unnest(words) WITH ORDINALITY AS w(word, i)
    WHERE word NOT IN ('*', '#')
$$;

-- The tags of a routing key (see above). Not STRICT, one expression: PostgreSQL inlines it
-- into the routing trigger's statement (a call of a SQL function costs ~6 us a message).
-- Places from the end through reverse(), not split_part's negative positions (PostgreSQL 14+).
CREATE OR REPLACE FUNCTION pgmb.key_tags(routing_key text) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT string_to_array(routing_key, '.') || ARRAY[
        '1.' || split_part(routing_key, '.', 1), '-1.' || reverse(split_part(reverse(routing_key), '.', 1)),
        '2.' || split_part(routing_key, '.', 2), '-2.' || reverse(split_part(reverse(routing_key), '.', 2)),
        '3.' || split_part(routing_key, '.', 3), '-3.' || reverse(split_part(reverse(routing_key), '.', 3)),
        '4.' || split_part(routing_key, '.', 4), '-4.' || reverse(split_part(reverse(routing_key), '.', 4))]
$$;

-- The refusal of a routing key that the rule (pgmb.valid_routing_key) rejects, worded by
-- pgmb.check_routing_key, raised as the CHECK pgmb_message_routing_key_valid did.
CREATE OR REPLACE FUNCTION pgmb.refuse_routing_key(routing_key text) RETURNS void
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

-- ==== pgmb/sql/schema/tables.sql ====
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
        CHECK (dedup_window >= 0 AND dedup_window <= 2592000);

-- A queue's binding tags (pgmb.binding_tags of its binding key, kept by pgmb.prepare_queue):
-- the routing trigger takes to the regex only the queues whose tags are all tags of the key,
-- and with many queues finds them through this GIN index. fastupdate off: a new queue's
-- entries go straight into the index, so no publish pays for merging a pending list.
ALTER TABLE pgmb_queue ADD COLUMN IF NOT EXISTS binding_tags text[] NOT NULL DEFAULT '{}';
CREATE INDEX IF NOT EXISTS pgmb_queue_binding_tags ON pgmb_queue USING gin (binding_tags)
    WITH (fastupdate = off);

ALTER TABLE pgmb_message
    ALTER COLUMN id SET DEFAULT pgmb.uuid_v7(),
    ALTER COLUMN headers SET DEFAULT '{}',
    ALTER COLUMN created_at SET DEFAULT now(),
    ALTER COLUMN available_at SET DEFAULT now(),
    ADD CONSTRAINT pgmb_message_headers_object CHECK (jsonb_typeof(headers) = 'object');

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

-- An acknowledgement has a 2xx status, a failure has not: without the joint statistics
-- the planner multiplies the two conditions of "5xx failures" as if they were unrelated,
-- expects a tenth of the rows and counts them (or plans for a few) where there are many.
-- (In schema pgmb, with pgmb's other objects that are not Django's.)
CREATE STATISTICS IF NOT EXISTS pgmb.attempt_outcome_status (mcv)
    ON outcome, status_code FROM pgmb_attempt;

-- ==== the trigger functions of pgmb_worker and pgmb_queue ====

-- The BEFORE INSERT OR UPDATE trigger function of pgmb_worker: the name, endpoint, rate,
-- timeout and secret rules for every writer (an unchanged endpoint or secret stays
-- accepted), then the circuit breaker's settings (pgmb.check_breaker).
CREATE OR REPLACE FUNCTION pgmb.prepare_worker(w public.pgmb_worker) RETURNS public.pgmb_worker
    LANGUAGE plpgsql
    AS $_$
DECLARE
    problem text;
BEGIN
    PERFORM pgmb.check_name('worker', w.name);
    IF (w.endpoint IS NULL
        OR w.endpoint !~ '^[Hh][Tt][Tt][Pp][Ss]?://[^/?#\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]+(?:[/?#][^\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]*)?$')
       AND NOT EXISTS (SELECT 1 FROM pgmb_worker o WHERE o.id = w.id AND o.endpoint = w.endpoint) THEN
        RAISE EXCEPTION 'invalid endpoint % for worker %', quote_nullable(w.endpoint), w.name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The endpoint must be an http:// or https:// URL without blanks.';
    END IF;
    IF w.rps IS NULL OR w.rps <= 0 THEN
        RAISE EXCEPTION 'invalid rps % for worker %: it must be at least 1 request per second', w.rps, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.timeout IS NULL OR w.timeout <= 0 THEN
        RAISE EXCEPTION 'invalid timeout % for worker %: it must be positive', w.timeout, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    problem := pgmb.secret_problem(w.secret);
    IF problem IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM pgmb_worker o WHERE o.id = w.id AND o.secret = w.secret) THEN
        RAISE EXCEPTION 'invalid secret for worker %: %', w.name, problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use whsec_ and base64 (padded or not), or a text without control characters.';
    END IF;
    w := pgmb.check_breaker(w);
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
    -- stored before the rule can still be paused.
    SELECT w.name, w.timeout INTO worker, timeout FROM pgmb_worker w
    WHERE w.id = q.worker_id
      AND NOT EXISTS (SELECT FROM pgmb_queue o
                      WHERE o.id = q.id AND o.worker_id = q.worker_id AND o.lease_seconds = q.lease_seconds);
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

-- ==== pgmb/sql/schema/views.sql ====
-- The monitoring views of the SQL API (secrets are never shown), and each queue's own pair
-- of views, pgmb.<stem>_queue and pgmb.<stem>_dead_letter_queue, which the queue_views
-- trigger of pgmb_queue keeps with pgmb.create_queue_views and pgmb.drop_queue_views.

-- An endpoint as it may be shown: the user name and password of the URL each replaced by
-- *** ('***:***' with a password, '***' without; the last '@' before the path ends them),
-- the scheme in lower case; a URL without them as it is. The masking of
-- pgmb.endpoint_masking.mask_credentials (tests/rules/test_credentials_mask.py: one table of
-- cases for both; docs/decisions/0028-secrets-stay-secret-in-the-admin.md).
CREATE OR REPLACE FUNCTION pgmb.mask_credentials(url text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
SELECT CASE
    WHEN m IS NULL THEN url
    ELSE lower(m[1]) || CASE WHEN strpos(m[2], ':') > 0 THEN '***:***' ELSE '***' END
         || '@' || m[3]
END
FROM (SELECT regexp_match(url, '^([A-Za-z][A-Za-z0-9+.-]*://)([^/?#]*)@(.*)$') AS m) AS parsed
$$;

-- The workers, with whether they sign their requests (by their secret or a retiring one,
-- pgmb.signing_secrets) instead of their secrets, and their endpoints' credentials masked.
CREATE OR REPLACE VIEW pgmb.workers AS
SELECT w.id, w.name, pgmb.mask_credentials(w.endpoint) AS endpoint, w.rps, w.timeout, w.active,
       cardinality(pgmb.signing_secrets(w.secret, w.id, now())) > 0 AS signed, w.created_at
FROM pgmb_worker w;

-- The queues with their counts of live deliveries and dead letters; a pull queue has no
-- worker (worker_id and worker NULL).
CREATE OR REPLACE VIEW pgmb.queues AS
SELECT q.id, q.name, q.binding_key, q.pattern, q.worker_id, w.name AS worker, q.max_retries,
       q.backoff_base, q.backoff_max, q.lease_seconds, q.paused,
       (SELECT count(*) FROM pgmb_delivery d WHERE d.queue_id = q.id) AS pending,
       (SELECT count(*) FROM pgmb_dead_letter x WHERE x.queue_id = q.id) AS dead_letters,
       q.created_at
FROM pgmb_queue q LEFT JOIN pgmb_worker w ON w.id = q.worker_id;

-- The messages, and whether any queue took them (routed).
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
       CASE WHEN d.state = 'waiting' THEN 'waiting'
            WHEN d.available_at <= now() THEN 'ready'
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

-- The dead letters of every queue, with their messages.
CREATE OR REPLACE VIEW pgmb.dead_letter_entries AS
SELECT x.queue_id, q.name AS queue, x.message_id, m.routing_key, m.body, m.headers,
       x.attempts, x.last_status, x.last_error, x.created_at AS dead_at, m.created_at
FROM pgmb_dead_letter x
JOIN pgmb_queue q ON q.id = x.queue_id
JOIN pgmb_message m ON m.id = x.message_id;

-- Creates (or replaces) a queue's views: pgmb.<stem>_queue over pgmb.queue_entries and
-- pgmb.<stem>_dead_letter_queue over pgmb.dead_letter_entries. Both functions run as their
-- owner (SECURITY DEFINER, set in access.sql), who owns the views, so that whoever may
-- create a queue (pgmb_admin) need not create in schema pgmb.
CREATE OR REPLACE FUNCTION pgmb.create_queue_views(queue_id uuid, queue_name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    closed boolean := pgmb.refuse_writable_schemas();  -- first (tables.sql)
    base text := pgmb.view_base(queue_name);
BEGIN
    EXECUTE format('CREATE OR REPLACE VIEW pgmb.%I AS SELECT * FROM pgmb.queue_entries WHERE queue_id = %L',
                   base || '_queue', queue_id);
    EXECUTE format('CREATE OR REPLACE VIEW pgmb.%I AS SELECT * FROM pgmb.dead_letter_entries WHERE queue_id = %L',
                   base || '_dead_letter_queue', queue_id);
END $$;

-- Drops a queue's two views (a queue deleted or renamed).
CREATE OR REPLACE FUNCTION pgmb.drop_queue_views(queue_name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    closed boolean := pgmb.refuse_writable_schemas();  -- first (tables.sql)
    base text := pgmb.view_base(queue_name);
BEGIN
    EXECUTE format('DROP VIEW IF EXISTS pgmb.%I, pgmb.%I', base || '_queue', base || '_dead_letter_queue');
END $$;

-- Re-creates every queue's views, after the generic views they select from changed.
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

-- Each queue's views select from the generic ones above: re-made whenever those change.
SELECT pgmb.refresh_queue_views();

-- ==== pgmb/sql/schema/publish.sql ====
-- Publishing: the SQL API (pgmb.send and its shorter forms, pgmb.worker, pgmb.create), the
-- message options (priority, groups, dependencies, de-duplication, per-message retries),
-- holding and releasing waiting deliveries, and waking dispatchers. The routing itself is
-- the route_messages trigger of pgmb_message (pgmb/sql/queries/triggers.sql).

-- Called by the routing trigger after a statement that created deliveries: a NOTIFY on
-- channel pgmb, at commit, when some running dispatcher or pull consumer waits for one
-- (or under an isolation level where the check could miss one). The setting pgmb.notify =
-- off turns it off for bulk loads.
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

-- Why the options of a message are refused, or NULL. The same rules as
-- pgmb.options.check_options in Python (tests/rules holds one table of cases for both).
CREATE OR REPLACE FUNCTION pgmb.message_options_problem(
    message_id uuid, priority integer, group_key text, depends_on uuid[], dedup_id text,
    max_retries integer, retry_delay float8
) RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    IF priority IS NULL OR priority NOT BETWEEN -32768 AND 32767 THEN
        RETURN format('invalid priority %s: it must be a whole number from -32768 to 32767 (lower goes first)',
                      coalesce(priority::text, 'NULL'));
    END IF;
    IF group_key IS NOT NULL AND (length(group_key) > 128 OR NOT pgmb.valid_key(group_key)) THEN
        RETURN format('invalid group %s: 1 to 128 characters, no blanks or control characters',
                      quote_literal(group_key));
    END IF;
    IF dedup_id IS NOT NULL AND (length(dedup_id) > 128 OR NOT pgmb.valid_key(dedup_id)) THEN
        RETURN format('invalid dedup id %s: 1 to 128 characters, no blanks or control characters',
                      quote_literal(dedup_id));
    END IF;
    IF max_retries IS NOT NULL AND max_retries NOT BETWEEN 0 AND 1000000 THEN
        RETURN format('invalid max_retries %s: it must be from 0 to 1000000', max_retries);
    END IF;
    IF retry_delay IS NOT NULL THEN
        -- The delay rule (pgmb.check_delay), and at most the 30 days of a queue's backoff.
        IF retry_delay = 'NaN'::float8 OR retry_delay IN ('Infinity'::float8, '-Infinity'::float8)
           OR retry_delay < 0 OR retry_delay > 2592000 THEN
            RETURN format('invalid retry delay %s: it must be from 0 to 2592000 seconds (30 days)', retry_delay);
        END IF;
    END IF;
    IF depends_on IS NOT NULL THEN
        IF cardinality(depends_on) = 0 OR cardinality(depends_on) > 100 THEN
            RETURN 'invalid depends_on: name 1 to 100 messages (or none at all: NULL)';
        END IF;
        IF array_position(depends_on, NULL) IS NOT NULL THEN
            RETURN 'invalid depends_on: a message id is NULL';
        END IF;
        IF message_id = ANY (depends_on) THEN
            RETURN format('invalid depends_on: message %s cannot depend on itself', message_id);
        END IF;
    END IF;
    RETURN NULL;
END $$;

-- Raises the problem pgmb.message_options_problem finds in a message's options (as
-- invalid_parameter_value); true otherwise.
CREATE OR REPLACE FUNCTION pgmb.check_message_options(
    message_id uuid, priority integer, group_key text, depends_on uuid[], dedup_id text,
    max_retries integer, retry_delay float8
) RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    problem text := pgmb.message_options_problem(message_id, priority, group_key, depends_on,
                                                 dedup_id, max_retries, retry_delay);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '%', problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN true;
END $$;

-- Whether a message may not set this header (any case): HTTP's framing and encoding, what
-- a receiver or a proxy in front of it trusts, and what pgmb sets itself. The same list as
-- pgmb/worker_request.py RESERVED and RESERVED_PREFIXES (tests/rules, one table of cases);
-- pgmb.message_problem refuses these at publish, pgmb.run_headers drops them at delivery.
CREATE OR REPLACE FUNCTION pgmb.reserved_header(name text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT lower(name) = ANY ('{host,content-type,content-length,content-encoding,connection,transfer-encoding,expect,upgrade,te,trailer,keep-alive,proxy-connection,user-agent,authorization,proxy-authorization,cookie,forwarded}'::text[])
             OR lower(name) LIKE 'pgmb-%' OR lower(name) LIKE 'webhook-%' OR lower(name) LIKE 'x-forwarded-%' $$;

-- Why a message's body or headers are refused, or NULL: the rule of pgmb/message_limits.py
-- (the limits are its constants; tests/rules runs one table of cases through both). The
-- body and the headers nest containers at most 64 deep (the value itself is 1); at most
-- 64 headers, each name and value together at most 8192 bytes (a value that is not a
-- string counts as its JSON text), 32768 in all; no reserved name (pgmb.reserved_header).
CREATE OR REPLACE FUNCTION pgmb.message_problem(body jsonb, headers jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    header text;
    size bigint;
    total bigint := 0;
    how_many integer;
BEGIN
    -- A container at level 64 below the body is at depth 65. Strict: lax mode would also
    -- unwrap arrays. The path stops at that level, so a deeper body costs no more.
    IF jsonb_path_exists(body, 'strict $.**{64} ? (@.type() == "object" || @.type() == "array")') THEN
        RETURN 'the body: nested deeper than 64 levels (limit max_depth)';
    END IF;
    IF jsonb_typeof(headers) IS DISTINCT FROM 'object' THEN
        RETURN NULL;  -- the CHECK pgmb_message_headers_object's to refuse
    END IF;
    SELECT count(*) INTO how_many FROM jsonb_object_keys(headers);
    IF how_many > 64 THEN
        RETURN format('%s headers, at most 64 (limit max_headers)', how_many);
    END IF;
    -- A header's value may be JSON too: the dispatcher and the admin turn it into text.
    IF jsonb_path_exists(headers, 'strict $.**{64} ? (@.type() == "object" || @.type() == "array")') THEN
        RETURN 'the headers: nested deeper than 64 levels (limit max_depth)';
    END IF;
    FOR header, size IN
        SELECT e.key, octet_length(e.key)::bigint + octet_length(CASE WHEN jsonb_typeof(e.value) = 'string'
                                                                      THEN e.value #>> '{}' ELSE e.value::text END)
        FROM jsonb_each(headers) AS e
    LOOP
        IF pgmb.reserved_header(header) THEN
            RETURN format('header %s is reserved: the broker or the worker sets it', quote_literal(header));
        END IF;
        IF size > 8192 THEN
            RETURN format('header %s has %s bytes, at most 8192 (limit max_header_bytes)',
                          quote_literal(left(header, 64)), size);
        END IF;
        total := total + size;
    END LOOP;
    IF total > 32768 THEN
        RETURN format('the headers have %s bytes, at most 32768 (limit max_headers_bytes)', total);
    END IF;
    RETURN NULL;
END $$;

-- Whether pgmb.message_problem finds nothing, its cheap part inline: the routing trigger
-- tests every message with it, and most have no headers.
CREATE OR REPLACE FUNCTION pgmb.acceptable_message(body jsonb, headers jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT NOT jsonb_path_exists(body, 'strict $.**{64} ? (@.type() == "object" || @.type() == "array")')
             AND (headers = '{}'::jsonb OR pgmb.message_problem(body, headers) IS NULL) $$;

-- The refusal of a row of pgmb_message that the routing trigger's checks reject: its
-- routing key (pgmb.refuse_routing_key), or its body or headers, raised as a CHECK
-- violation of pgmb_message_body_valid or pgmb_message_headers_valid naming the limit.
CREATE OR REPLACE FUNCTION pgmb.refuse_message(message_id uuid, routing_key text, body jsonb, headers jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    problem text;
BEGIN
    IF NOT coalesce(pgmb.valid_routing_key(routing_key), false) THEN
        PERFORM pgmb.refuse_routing_key(routing_key);
    END IF;
    problem := pgmb.message_problem(body, headers);
    RAISE EXCEPTION 'message % refused by %: %', message_id,
            CASE WHEN starts_with(problem, 'the body') THEN 'pgmb_message_body_valid' ELSE 'pgmb_message_headers_valid' END,
            problem
        USING ERRCODE = 'check_violation', TABLE = 'pgmb_message',
              CONSTRAINT = CASE WHEN starts_with(problem, 'the body') THEN 'pgmb_message_body_valid'
                                ELSE 'pgmb_message_headers_valid' END;
END $$;

-- The messages that a message with this dedup id, created then, duplicates for a queue of
-- this dedup window and pattern: those with the same dedup id, created within the window,
-- whose routing key the queue's binding matches. De-duplication is per queue
-- (docs/decisions/0032-dedup-per-queue.md): a message sent elsewhere suppresses nothing.
CREATE OR REPLACE FUNCTION pgmb.duplicated(dedup_window float8, pattern text, message_id uuid,
                                           dedup_id text, created_at timestamptz)
RETURNS SETOF uuid
LANGUAGE sql STABLE AS $$
    SELECT x.id FROM pgmb_message x
    WHERE duplicated.dedup_window > 0
      AND x.dedup_id = duplicated.dedup_id AND x.id <> duplicated.message_id
      AND x.created_at > duplicated.created_at - duplicated.dedup_window * interval '1 second'
      AND ('.' || x.routing_key) ~ duplicated.pattern
$$;

-- The message a duplicate was dropped for: the newest with this dedup id that one of the
-- queues of the duplicate's routing key matches (pgmb.duplicated).
CREATE OR REPLACE FUNCTION pgmb.deduplicated(dedup_id text, routing_key text) RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT x.id FROM pgmb_message x
    WHERE x.dedup_id = deduplicated.dedup_id
      AND EXISTS (SELECT FROM pgmb_queue q
                  WHERE q.binding_tags <@ pgmb.key_tags(deduplicated.routing_key)
                    AND ('.' || deduplicated.routing_key) ~ q.pattern
                    AND ('.' || x.routing_key) ~ q.pattern)
    ORDER BY x.created_at DESC, x.id DESC LIMIT 1
$$;

-- Before each message with dependencies or a de-duplication id is stored (the admit_message
-- trigger's WHEN): enforces the options rule (as the check pgmb_message_options_valid,
-- with that name), refuses unknown dependencies (to a caller that may read messages),
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
    -- The options rule, reported as a check violation of pgmb_message_options_valid.
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'message % refused by pgmb_message_options_valid: %', m.id, problem
            USING ERRCODE = 'check_violation', CONSTRAINT = 'pgmb_message_options_valid';
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
                                                                         m.dedup_id, created))) THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN m;
END $$;

-- Whether a delivery must wait: an earlier live delivery of its group on its queue, or a
-- dependency with a live delivery or a dead letter anywhere.
CREATE OR REPLACE FUNCTION pgmb.delivery_blocked(delivery_id bigint, queue_id uuid, group_key text, depends_on uuid[])
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT (group_key IS NOT NULL AND EXISTS (
                SELECT FROM pgmb_delivery h
                WHERE h.queue_id = delivery_blocked.queue_id AND h.group_key = delivery_blocked.group_key
                  AND h.id < delivery_id))
        OR (depends_on IS NOT NULL AND (
                EXISTS (SELECT FROM pgmb_delivery x WHERE x.message_id = ANY (delivery_blocked.depends_on))
                OR EXISTS (SELECT FROM pgmb_dead_letter x
                           WHERE x.message_id = ANY (delivery_blocked.depends_on))))
$$;

-- Before each delivery with a group or dependencies is stored: 'waiting' if it must wait.
-- The locks make a concurrent settlement of what it waits for either finish first (then
-- it is seen gone here) or wait for this transaction (then its trigger sees this row).
CREATE OR REPLACE FUNCTION pgmb.hold_delivery(d pgmb_delivery) RETURNS pgmb_delivery
LANGUAGE plpgsql AS $$
DECLARE
    previous bigint;
BEGIN
    IF d.group_key IS NOT NULL THEN
        -- Publishers of one group take turns, so two cannot both start an empty group.
        PERFORM pg_advisory_xact_lock(hashtextextended('pgmb group ' || d.queue_id || ' ' || d.group_key, 0));
        LOOP
            SELECT p.id INTO previous FROM pgmb_delivery p
            WHERE p.queue_id = d.queue_id AND p.group_key = d.group_key AND p.id < d.id
            ORDER BY p.id DESC LIMIT 1
            FOR KEY SHARE;
            -- Nothing locked: the group is empty, or its last member left meanwhile.
            EXIT WHEN FOUND OR NOT EXISTS (
                SELECT FROM pgmb_delivery p
                WHERE p.queue_id = d.queue_id AND p.group_key = d.group_key AND p.id < d.id);
        END LOOP;
    END IF;
    IF d.depends_on IS NOT NULL THEN
        -- Marks (and so locks) the dependencies' live deliveries: their removal releases
        -- this one (the AFTER DELETE trigger fires for marked rows only).
        UPDATE pgmb_delivery x SET dependents = true
        WHERE x.message_id = ANY (d.depends_on) AND x.id <> d.id;
    END IF;
    IF pgmb.delivery_blocked(d.id, d.queue_id, d.group_key, d.depends_on) THEN
        d.state := 'waiting';
    END IF;
    RETURN d;
END $$;

-- Whether some waiting delivery depends on this message (requeue and replay mark the
-- deliveries they create, as hold_delivery marks the ones that exist).
CREATE OR REPLACE FUNCTION pgmb.has_dependents(message_id uuid) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT FROM pgmb_delivery w
                   WHERE w.depends_on @> ARRAY[has_dependents.message_id] AND w.state = 'waiting')
$$;

-- Make these waiting deliveries ready where nothing holds them any more.
CREATE OR REPLACE FUNCTION pgmb.promote_waiting(delivery_ids bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    candidate bigint;
    promoted integer := 0;
BEGIN
    FOR candidate IN SELECT DISTINCT c FROM unnest(delivery_ids) AS c WHERE c IS NOT NULL ORDER BY c LOOP
        -- Locked first, judged in the next statement: two settlements that each release
        -- half of its conditions take turns, and the second sees the first's.
        PERFORM FROM pgmb_delivery w WHERE w.id = candidate AND w.state = 'waiting' FOR NO KEY UPDATE;
        CONTINUE WHEN NOT FOUND;
        UPDATE pgmb_delivery w SET state = 'ready'
        WHERE w.id = candidate AND w.state = 'waiting'
          AND NOT pgmb.delivery_blocked(w.id, w.queue_id, w.group_key, w.depends_on);
        IF FOUND THEN
            promoted := promoted + 1;
        END IF;
    END LOOP;
    IF promoted > 0 THEN
        PERFORM pgmb.wake_dispatchers();
    END IF;
    RETURN promoted;
END $$;

-- After a dead letter leaves (purged, requeued, its queue deleted): the deliveries that
-- depend on its message (a requeued dependency is live again and keeps them waiting).
CREATE OR REPLACE FUNCTION pgmb.release_dependents(message_id uuid) RETURNS void
LANGUAGE sql AS $$
    SELECT pgmb.promote_waiting(ARRAY(
        SELECT w.id FROM pgmb_delivery w
        WHERE w.depends_on @> ARRAY[release_dependents.message_id] AND w.state = 'waiting'))
$$;

-- After a delivery with a group or dependents leaves the hot table (acked, dead-lettered,
-- its queue deleted): its group's new head, and the deliveries that depend on its message.
CREATE OR REPLACE FUNCTION pgmb.release_after(d pgmb_delivery) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmb.promote_waiting(
        ARRAY(SELECT h.id FROM pgmb_delivery h
              WHERE d.group_key IS NOT NULL AND h.queue_id = d.queue_id AND h.group_key = d.group_key
              ORDER BY h.id LIMIT 1)
        || ARRAY(SELECT w.id FROM pgmb_delivery w
                 WHERE d.dependents AND w.depends_on @> ARRAY[d.message_id] AND w.state = 'waiting'));
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

-- pgmb.send with a delay in whole seconds (checked by pgmb.check_delay).
CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb, delay integer)
RETURNS uuid
LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgmb.send(id, routing_key, body, headers,
                     now() + make_interval(secs => coalesce(pgmb.check_delay(delay), 0)));
END $$;

-- pgmb.send with headers, due now.
CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT pgmb.send(id, routing_key, body, headers, NULL::timestamptz) $$;

-- pgmb.send of a body alone, due now.
CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT pgmb.send(id, routing_key, body, NULL::jsonb, NULL::timestamptz) $$;

-- The messages among these that no queue got: no binding matched their routing key when
-- they were published (routing happens once, at publish time).
CREATE OR REPLACE FUNCTION pgmb.unrouted(message_ids uuid[]) RETURNS SETOF uuid
LANGUAGE sql STABLE AS $$
    SELECT u.id FROM unnest(message_ids) WITH ORDINALITY AS u(id, n)
    WHERE EXISTS (SELECT 1 FROM pgmb_message m WHERE m.id = u.id)
      AND NOT EXISTS (SELECT 1 FROM pgmb_delivery d WHERE d.message_id = u.id)
      AND NOT EXISTS (SELECT 1 FROM pgmb_dead_letter x WHERE x.message_id = u.id)
      AND NOT EXISTS (SELECT 1 FROM pgmb_attempt a WHERE a.message_id = u.id)
    ORDER BY u.n
$$;

-- Registers a worker (an HTTP endpoint and its rate limit); returns its id.
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

-- The order the seed's Quick Start uses: (name, binding_key, worker_id, max_retries).
CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, worker_id uuid, max_retries integer)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT pgmb.create(name, binding_key, max_retries, worker_id) $$;

-- pgmb.send acts for its caller (pgmb.pin_definers, tables.sql): a producer role needs
-- pgmb_producer, no privilege on the tables.
SELECT pgmb.pin_definers(ARRAY[
    'pgmb.send(uuid, text, jsonb, jsonb, timestamptz, integer, text, uuid[], text, integer, float8)'
]);

-- ==== pgmb/sql/schema/deliveries.sql ====
-- The delivery state machine that both dispatch paths share: claim (lease), start, ack,
-- fail (retry or dead-letter), release, reclaim expired leases; requeueing, purging and
-- replaying; and what a dispatcher asks to know whether, and when, there is work.

-- Whether a dispatcher running --until-idle still has work: anything due, leased, or
-- scheduled for a retry. Messages their producer delayed do not keep it running, nor do
-- waiting deliveries: one held by a dead-lettered dependency has nothing to do (`pgmb_dispatch
-- --until-idle` would never stop), and one behind a live delivery is busy through that one.
CREATE OR REPLACE FUNCTION pgmb.busy(queue_names text[]) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT EXISTS (
        SELECT 1 FROM pgmb_delivery d JOIN pgmb_queue qu ON qu.id = d.queue_id
        JOIN pgmb_worker wk ON wk.id = qu.worker_id
        WHERE (queue_names IS NULL OR qu.name = ANY (queue_names))
          AND NOT qu.paused AND wk.active
          AND (d.state = 'leased'
               OR (d.state = 'ready' AND (d.attempts > 0 OR d.available_at <= clock_timestamp())))
    )
$$;

-- The first due time of a queue's ready deliveries, and whether one is due by a time: one
-- probe of the claim index per priority in use (it leads with priority, so the queue's
-- first entry is only the earliest of its most urgent priority). Reading the entries
-- instead would read every delayed one. PL/pgSQL: its plans are kept for the session.
CREATE OR REPLACE FUNCTION pgmb.next_due(queue_id uuid, due_by timestamptz DEFAULT NULL) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    lvl smallint;
    due timestamptz;
    earliest timestamptz;
BEGIN
    SELECT d.priority, d.available_at INTO lvl, earliest FROM pgmb_delivery d
    WHERE d.queue_id = next_due.queue_id AND d.state = 'ready'
    ORDER BY d.priority, d.available_at LIMIT 1;
    LOOP
        -- With due_by: any due time not after it will do (the claim asks only that).
        EXIT WHEN lvl IS NULL OR earliest <= due_by;
        SELECT d.priority, d.available_at INTO lvl, due FROM pgmb_delivery d
        WHERE d.queue_id = next_due.queue_id AND d.state = 'ready' AND d.priority > lvl
        ORDER BY d.priority, d.available_at LIMIT 1;
        EXIT WHEN NOT FOUND;
        earliest := least(earliest, due);
    END LOOP;
    RETURN earliest;
END $$;

-- Seconds until something may be claimable for these queues (NULL: nothing pending):
-- the next due delivery (the first per priority, pgmb.next_due), the next token of a
-- rate-limited worker, the next lease to expire, the end of a circuit breaker's cool-down.
-- PL/pgSQL for its kept plan, as pgmb.ack: the dispatchers ask this after most claims.
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

-- Marks leased deliveries as started: their request is about to be made, so the expiry of
-- the lease counts as an attempt (pgmb.reclaim_expired). Fenced by the lease ids. Planned
-- as pgmb.claim.
CREATE OR REPLACE FUNCTION pgmb.start(delivery_ids bigint[], lease_ids uuid[]) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode = force_custom_plan SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
    AS $$
DECLARE
    marked integer;
BEGIN
    IF cardinality(delivery_ids) IS DISTINCT FROM cardinality(lease_ids) THEN
        RAISE EXCEPTION 'pgmb.start needs one lease id per delivery id (% delivery ids, % lease ids)',
                        coalesce(cardinality(delivery_ids), 0), coalesce(cardinality(lease_ids), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pgmb_delivery d SET started = true
    FROM unnest(delivery_ids, lease_ids) AS u(id, lease_id)
    WHERE d.id = u.id AND d.id = ANY (delivery_ids) AND d.lease_id = u.lease_id AND d.state = 'leased' AND NOT d.started;
    GET DIAGNOSTICS marked = ROW_COUNT;
    RETURN marked;
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

-- Records failed attempts of leased deliveries (fenced by their lease ids): each is
-- dead-lettered after its last attempt (1 + the message's or the queue's max_retries), or
-- retried after the message's fixed retry_delay or the queue's backoff (an endpoint's
-- Retry-After may lengthen either); every attempt goes to the history, with outcome `retry_outcome`
-- or 'dead'. The circuit breakers hear of the outcomes first. Planned as pgmb.claim.
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

-- Records failed attempts (pgmb.settle_failures with outcome 'retry'): each delivery is
-- retried after its backoff, or dead-lettered after its last attempt.
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

-- Every dead letter of a queue back to it (pgmb.requeue of their ids).
CREATE OR REPLACE FUNCTION pgmb.requeue(queue_name text)
RETURNS integer
LANGUAGE sql AS $$
    SELECT pgmb.requeue(array_agg(x.id))
    FROM pgmb_dead_letter x JOIN pgmb_queue q ON q.id = x.queue_id
    WHERE q.name = queue_name
$$;

-- Dead letters an operator gives up on: deleted (their attempts stay in the history).
CREATE OR REPLACE FUNCTION pgmb.purge_dead_letters(dead_letter_ids bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM pgmb_dead_letter x WHERE x.id = ANY (dead_letter_ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Every dead letter of a queue, deleted (their attempts stay in the history).
CREATE OR REPLACE FUNCTION pgmb.purge_dead_letters(queue_name text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM pgmb_dead_letter x USING pgmb_queue q
    WHERE q.id = x.queue_id AND q.name = queue_name;
    GET DIAGNOSTICS n = ROW_COUNT;
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

-- The advisory lock keys of the archive: 'job' (one archive job at a time, held for its
-- run) and 'claim' (taken by each claim batch, and shared by pgmb.replay).
CREATE OR REPLACE FUNCTION pgmb.archive_lock_key(kind text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('pgmb archive ' || kind, 0)
$$;

-- ==== pgmb/sql/schema/breakers.sql ====
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

-- Seconds a breaker stays open after its n-th opening in a row: the cool-down, doubled
-- for each failed probe, at most the cap.
CREATE OR REPLACE FUNCTION pgmb.breaker_cooldown(cooldown float8, cooldown_max float8, trips integer) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT least(cooldown_max, cooldown * 2 ^ least(greatest(trips - 1, 0), 30))
$$;

-- Tell whoever listens (the dispatcher's log, the server log) of a transition, once: each
-- transition is made by one transaction, which raises this once.
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
        IF w.breaker_state = 'half_open' THEN
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

-- ==== pgmb/sql/schema/pull.sql ====
-- Pull queues, consumed by clients (SQS/PGMQ style) instead of a worker.
--
-- A pull queue is a queue row without a worker (worker_id NULL). Routing fills it like any
-- other; push claims never see it (pgmb.claim, busy and next_wakeup join the worker). A
-- client reads from it: a read leaves the delivery 'ready', counts it (attempts = read_ct)
-- and moves available_at to the end of the visibility timeout, so the same index scan of
-- pgmb_delivery_due that finds new messages finds one whose timeout ran out, with no
-- dispatcher running, and pgmb.reclaim_expired (leased rows only) never sees a read
-- (docs/decisions/0014-pull-queues-in-the-same-tables.md). A read that would be number 2 + max_retries dead-letters the
-- delivery instead. Deleting is an ack ('ack' in the history), archiving records its own
-- outcome ('archived'), nack (a failed handler) schedules a retry.

-- The pull queue named queue_name (its id, max_retries, whether it is paused), or an error.
-- Every entry point comes here first: a role may consume only the queues granted to it
-- (access control, access.sql), and is refused before anything is read or written. The
-- access is checked before anything else is said about the queue: a role that may not
-- consume it gets the same refusal whether it exists or not, is a pull queue or not
-- (docs/decisions/0039-refusals-tell-nothing.md).
CREATE OR REPLACE FUNCTION pgmb.pull_queue(queue_name text, OUT id uuid, OUT max_retries integer, OUT paused boolean)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    worker text;
BEGIN
    -- Before any comparison a planted operator could match (tables.sql).
    PERFORM pgmb.refuse_writable_schemas();
    SELECT q.id, q.max_retries, q.paused, w.name INTO id, max_retries, paused, worker
    FROM pgmb_queue q LEFT JOIN pgmb_worker w ON w.id = q.worker_id
    WHERE q.name = queue_name;
    IF id IS NULL OR NOT pgmb.may('consume', id) THEN
        -- Raises: "does not exist" only to a role that may consume every queue.
        PERFORM pgmb.require('consume', queue_name);
    END IF;
    IF worker IS NOT NULL THEN
        -- The worker is named to administrators only: a consumer granted a push queue
        -- has no business with its worker.
        RAISE EXCEPTION 'queue % is not a pull queue: %', quote_literal(queue_name),
                        CASE WHEN pgmb.may('administer') THEN format('worker %L receives its messages', worker)
                             ELSE 'a worker receives its messages' END
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'Clients read only from queues without a worker: pgmb.create(name, binding_key, max_retries, NULL).';
    END IF;
END $$;

-- The checks of a read's arguments, each with its own message.
CREATE OR REPLACE FUNCTION pgmb.check_pull_args(vt double precision, qty integer, filter jsonb)
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

-- Deliveries among delivery_ids that exist but belong to another queue than queue_id, one
-- the caller may consume too: an error, before anything is written. Ids that do not exist
-- (settled already) are skipped, and so are those of queues the caller may not consume,
-- which it must not learn about (docs/decisions/0039-refusals-tell-nothing.md).
CREATE OR REPLACE FUNCTION pgmb.check_pull_ids(queue_name text, queue_id uuid, delivery_ids bigint[])
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    foreign_ids text;
BEGIN
    IF delivery_ids IS NULL OR array_position(delivery_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'invalid message ids: NULL is not a message id'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT string_agg(d.id::text, ', ' ORDER BY d.id) INTO foreign_ids
    FROM pgmb_delivery d
    WHERE d.id = ANY (delivery_ids) AND d.queue_id <> check_pull_ids.queue_id
      AND pgmb.may('consume', d.queue_id);
    IF foreign_ids IS NOT NULL THEN
        RAISE EXCEPTION 'messages % are not in queue %', foreign_ids, quote_literal(queue_name)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A message id is the delivery id a read of this queue returned.';
    END IF;
END $$;

-- pgmb.read that waits up to max_poll_seconds, polling every poll_interval_ms, until
-- something can be read (PGMQ's read_with_poll).
CREATE OR REPLACE FUNCTION pgmb.read_with_poll(queue_name text, vt double precision, qty integer,
                                    max_poll_seconds double precision DEFAULT 5,
                                    poll_interval_ms integer DEFAULT 100,
                                    filter jsonb DEFAULT NULL)
RETURNS SETOF pgmb.pull_message LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz;
BEGIN
    PERFORM pgmb.refuse_writable_schemas();  -- first (tables.sql)
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

-- Reads and deletes in one step (PGMQ's pop): the messages are acknowledged as read.
CREATE OR REPLACE FUNCTION pgmb.pop(queue_name text, qty integer DEFAULT 1)
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

-- Acknowledges read messages: their deliveries are deleted and the history says 'ack'.
-- Returns the ids deleted (PGMQ's delete).
CREATE OR REPLACE FUNCTION pgmb.delete(queue_name text, delivery_ids bigint[])
RETURNS SETOF bigint LANGUAGE sql AS $$
    SELECT pgmb.settle_reads(queue_name, delivery_ids, 'ack')
$$;

-- pgmb.delete of one message: whether it was deleted.
CREATE OR REPLACE FUNCTION pgmb.delete(queue_name text, delivery_id bigint)
RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (SELECT FROM pgmb.delete(queue_name, ARRAY[delivery_id]))
$$;

-- Like pgmb.delete, with outcome 'archived' in the history (PGMQ's archive): the message is
-- kept, neither delivered nor failed.
CREATE OR REPLACE FUNCTION pgmb.archive(queue_name text, delivery_ids bigint[])
RETURNS SETOF bigint LANGUAGE sql AS $$
    SELECT pgmb.settle_reads(queue_name, delivery_ids, 'archived')
$$;

-- pgmb.archive of one message: whether it was archived.
CREATE OR REPLACE FUNCTION pgmb.archive(queue_name text, delivery_id bigint)
RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (SELECT FROM pgmb.archive(queue_name, ARRAY[delivery_id]))
$$;

-- Makes read messages visible again after `vt` seconds from now (PGMQ's set_vt); returns
-- them as they now are.
CREATE OR REPLACE FUNCTION pgmb.set_vt(queue_name text, delivery_ids bigint[], vt double precision)
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

-- pgmb.set_vt of one message.
CREATE OR REPLACE FUNCTION pgmb.set_vt(queue_name text, delivery_id bigint, vt double precision)
RETURNS SETOF pgmb.pull_message LANGUAGE sql AS $$
    SELECT * FROM pgmb.set_vt(queue_name, ARRAY[delivery_id], vt)
$$;

-- Deletes every delivery of a pull queue (PGMQ's purge_queue); returns how many.
CREATE OR REPLACE FUNCTION pgmb.purge(queue_name text)
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

-- A read that failed (a handler raised): the delivery becomes visible again after the
-- message's retry_delay or the queue's backoff, or is dead-lettered if that was read number
-- 1 + max_retries (the message's, else the queue's); the error goes to the history. Fenced
-- by the read count: a reader whose timeout ran out, and whose message someone else has read
-- since, changes nothing. Returns how many were recorded.
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

-- Seconds until a message of the pull queue becomes visible (0: one is now; the first due
-- time per priority); NULL: empty, or paused (nothing is read until it is resumed).
CREATE OR REPLACE FUNCTION pgmb.pull_next_visible(queue_name text) RETURNS double precision
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    q record;
    due timestamptz;
BEGIN
    SELECT * INTO q FROM pgmb.pull_queue(queue_name);
    IF q.paused THEN
        RETURN NULL;
    END IF;
    -- The claim index leads with priority: one probe per priority in use (pgmb.next_due),
    -- not a scan of every entry for their minimum.
    due := pgmb.next_due(q.id);
    RETURN CASE WHEN due IS NOT NULL THEN greatest(0, extract(epoch FROM due - clock_timestamp()))::float8 END;
END $$;

-- Reads up to qty visible messages of a pull queue and hides them for vt seconds (PGMQ's
-- read); `filter` keeps those whose body contains it. The update and the dead-lettering find
-- their rows by primary key (id = ANY (ARRAY(...))), whatever the estimate, so the function
-- uses its generic plan (the settings at the end of this file): planning the statement at
-- every call cost ~8 % of a read(100) + delete (docs/benchmarks.md).
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

-- The entry points act for their caller (checked by pgmb.pull_queue), as pgmb.send does:
-- a consumer role needs a queue grant, no privilege on the tables (pgmb.pin_definers,
-- tables.sql).
SELECT pgmb.pin_definers(ARRAY[
    'pgmb.read(text, double precision, integer, jsonb)',
    'pgmb.read_with_poll(text, double precision, integer, double precision, integer, jsonb)',
    'pgmb.pop(text, integer)',
    'pgmb.delete(text, bigint[])', 'pgmb.delete(text, bigint)',
    'pgmb.archive(text, bigint[])', 'pgmb.archive(text, bigint)',
    'pgmb.set_vt(text, bigint[], double precision)', 'pgmb.set_vt(text, bigint, double precision)',
    'pgmb.nack(text, bigint[], integer[], text[])',
    'pgmb.purge(text)', 'pgmb.pull_next_visible(text)'
]);

-- pgmb.read plans its statement once per session (its generic plan), and with the settings
-- of the claim: a read planned against "no rows over many pages" would pick through
-- pgmb_delivery_message_queue and sort the whole queue (tests/sql/test_steady_plans.py).
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgmb.read(text, double precision, integer, jsonb)
    SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off;

-- ==== pgmb/sql/schema/metrics.sql ====
-- Metrics for monitoring (docs/sql-api.md): per queue and per worker, each in one query.

-- One queue's metrics; an unknown name is an error (42704), not an empty result.
CREATE OR REPLACE FUNCTION pgmb.metrics(queue_name text) RETURNS pgmb.queue_metrics
LANGUAGE plpgsql STABLE AS $$
DECLARE
    result pgmb.queue_metrics;
BEGIN
    SELECT * INTO result FROM pgmb.metrics_all() AS m WHERE m.queue_name = metrics.queue_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue % does not exist', quote_nullable(metrics.queue_name)
            USING ERRCODE = 'undefined_object',
                  HINT = 'SELECT name FROM pgmb_queue lists the queues; pgmb.metrics_all() gives them all.';
    END IF;
    RETURN result;
END $$;

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

-- ==== pgmb/sql/schema/dispatchers.sql ====
-- Running dispatchers register and heartbeat, so an operator sees them. Each dispatcher
-- (pgmb_dispatch, the in-database loop, or a pull consumer) has a row in pgmb_dispatcher
-- from its start; it beats every few seconds with its counters and marks itself stopped
-- on a graceful exit. One that stops beating without saying so (killed, its machine or
-- connection lost) is shown as gone once its last heartbeat is 60 s old. Stopped and gone
-- rows are removed by pgmb.maintenance() after a day. A dispatcher about to sleep marks
-- itself waiting, and publishers notify only while one waits (pgmb.wake_dispatchers).

-- A dispatcher's state: running, gone (no heartbeat for 60 s, as seen at `at`) or stopped.
CREATE OR REPLACE FUNCTION pgmb.dispatcher_state(heartbeat_at timestamptz, stopped_at timestamptz,
                                      at timestamptz DEFAULT now())
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN stopped_at IS NOT NULL THEN 'stopped'
                WHEN heartbeat_at < at - interval '60 seconds' THEN 'gone'
                ELSE 'running' END
$$;

-- Register a dispatcher; returns its id. A scheduled in-database loop runs again and
-- again (every second with pg_cron >= 1.5): its runs are one dispatcher over time, so a
-- new run replaces the stopped rows of earlier runs (same host and queues).
CREATE OR REPLACE FUNCTION pgmb.dispatcher_start(kind text, host text, pid integer, queues text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    new_id bigint;
BEGIN
    IF kind = 'in_database' THEN
        DELETE FROM pgmb_dispatcher d
        WHERE d.kind = 'in_database' AND d.stopped_at IS NOT NULL
          AND d.host = dispatcher_start.host AND d.queues IS NOT DISTINCT FROM dispatcher_start.queues;
    END IF;
    INSERT INTO pgmb_dispatcher (kind, host, pid, queues, started_at, heartbeat_at)
    VALUES (kind, coalesce(host, ''), pid, queues, clock_timestamp(), clock_timestamp())
    RETURNING pgmb_dispatcher.id INTO new_id;
    RETURN new_id;
END $$;

-- A heartbeat with the dispatcher's counters; false if its row is gone (removed by
-- maintenance after a long outage) or stopped: the dispatcher then registers again.
CREATE OR REPLACE FUNCTION pgmb.dispatcher_beat(dispatcher_id bigint, in_flight integer, delivered bigint, failed bigint)
RETURNS boolean
LANGUAGE sql AS $$
    WITH beat AS (
        UPDATE pgmb_dispatcher d
        SET heartbeat_at = clock_timestamp(), in_flight = dispatcher_beat.in_flight,
            delivered = dispatcher_beat.delivered, failed = dispatcher_beat.failed
        WHERE d.id = dispatcher_id AND d.stopped_at IS NULL
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM beat)
$$;

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

-- A dispatcher's claim came back full: it will claim again without being woken.
CREATE OR REPLACE FUNCTION pgmb.dispatcher_busy(dispatcher_id bigint) RETURNS void
LANGUAGE sql AS $$
    UPDATE pgmb_dispatcher d SET waiting = false WHERE d.id = dispatcher_id AND d.waiting IS NOT false
$$;

-- A graceful exit: the last counters, nothing in flight, not waiting; false if there was
-- no such row.
CREATE OR REPLACE FUNCTION pgmb.dispatcher_stop(dispatcher_id bigint, delivered bigint, failed bigint)
RETURNS boolean
LANGUAGE sql AS $$
    WITH stopped AS (
        UPDATE pgmb_dispatcher d
        SET stopped_at = clock_timestamp(), heartbeat_at = clock_timestamp(), in_flight = 0,
            delivered = dispatcher_stop.delivered, failed = dispatcher_stop.failed,
            waiting = false
        WHERE d.id = dispatcher_id AND d.stopped_at IS NULL
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM stopped)
$$;

-- The registered dispatchers and pull consumers, newest first, with their state.
CREATE OR REPLACE VIEW pgmb.dispatchers AS
SELECT d.id, d.kind, d.host, d.pid, d.queues, d.started_at, d.heartbeat_at, d.stopped_at,
       pgmb.dispatcher_state(d.heartbeat_at, d.stopped_at) AS state,
       d.in_flight, d.delivered, d.failed
FROM pgmb_dispatcher d
ORDER BY d.started_at DESC, d.id DESC;

-- ==== pgmb/sql/schema/indb.sql ====
-- The in-database dispatch path: pgmb.dispatch_loop claims, posts through the http
-- extension or the PL/Python transport (plpython.sql), signs requests like
-- pgmb/worker_request.py, records outcomes in batches, and is scheduled by pg_cron where
-- it is installed (pgmb.cron_install). Each part is optional: `manage.py check` says what
-- this database lacks.

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

-- The endpoint policy of the in-database path (docs/security.md, Endpoints): the networks
-- PGMB['ENDPOINT_POLICY'] allows and denies, written by manage.py pgmb_cron install and the
-- migration (pgmb.indb.write_endpoint_policy); the system check says when it differs from
-- the setting. One row; until written, the default policy (link-local refused).
CREATE TABLE IF NOT EXISTS pgmb.endpoint_policy (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    allow cidr[] NOT NULL DEFAULT '{}',
    deny cidr[] NOT NULL DEFAULT '{169.254.0.0/16,fe80::/10}'
);
INSERT INTO pgmb.endpoint_policy DEFAULT VALUES ON CONFLICT DO NOTHING;

-- The rule of pgmb.endpoint_policy.Policy.refuses (one table of cases runs both,
-- tests/security/test_endpoint_policy.py): an address in an allowed network is reachable,
-- else one in a denied network is refused, else it is reachable. An IPv4-mapped IPv6
-- address is judged as the IPv4 address it carries.
CREATE OR REPLACE FUNCTION pgmb.endpoint_refused(address inet, allow cidr[], deny cidr[])
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT NOT EXISTS (SELECT FROM unnest(allow) AS n WHERE a <<= n)
       AND EXISTS (SELECT FROM unnest(deny) AS n WHERE a <<= n)
    FROM (SELECT CASE WHEN family(address) = 6 AND address <<= '::ffff:0.0.0.0/96'::inet
                      THEN '0.0.0.0'::inet + (address - '::ffff:0.0.0.0'::inet)
                      ELSE address END AS a) AS mapped
$$;

-- Whether the database's endpoint policy refuses address (the PL/Python transport asks
-- before it connects).
CREATE OR REPLACE FUNCTION pgmb.endpoint_refused(address inet) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT pgmb.endpoint_refused(address, p.allow, p.deny)
                     FROM pgmb.endpoint_policy AS p),
                    pgmb.endpoint_refused(address, '{}', '{169.254.0.0/16,fe80::/10}'))
$$;

-- Whether the database's endpoint policy is the default one. pgsql-http resolves, connects
-- and follows redirects inside libcurl, where no policy can be checked: it is used only
-- under the default policy (whose link-local refusal it cannot enforce either; the
-- documented gap of the default).
CREATE OR REPLACE FUNCTION pgmb.endpoint_policy_is_default() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT p.allow = '{}' AND p.deny = '{169.254.0.0/16,fe80::/10}'
                     FROM pgmb.endpoint_policy AS p), true)
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

-- One POST through the database's transport (pgmb.http_transport): the http extension,
-- else PL/Python; an error says what to install when there is neither.
CREATE OR REPLACE FUNCTION pgmb.post(url text, body text, headers jsonb, timeout float8)
RETURNS pgmb.http_outcome
LANGUAGE plpgsql AS $$
BEGIN
    CASE pgmb.http_transport()
        WHEN 'http' THEN RETURN pgmb.post_via_http(url, body, headers, timeout);
        WHEN 'plpython3u' THEN
            RETURN pgmb.post_via_plpython(url, body, headers, timeout);
        ELSE
            PERFORM pgmb.no_transport();
    END CASE;
END $$;

-- The error of a database without a transport pgmb.post may use: none installed, or only
-- pgsql-http under an endpoint policy it cannot enforce.
CREATE OR REPLACE FUNCTION pgmb.no_transport() RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'http') THEN
        RAISE EXCEPTION 'pgmb: the http extension cannot enforce PGMB[''ENDPOINT_POLICY''] (it resolves, connects and follows redirects inside libcurl), so the in-database path does not use it under a policy other than the default'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Install plpython3u (pgmb''s PL/Python transport checks the policy), or run manage.py pgmb_dispatch instead.';
    END IF;
    RAISE EXCEPTION 'pgmb: no HTTP transport in this database'
        USING ERRCODE = 'feature_not_supported',
              HINT = 'Install the http extension (pgsql-http) or plpython3u, or run manage.py pgmb_dispatch instead.';
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

-- Unschedules pgmb's pg_cron jobs (pgmb-dispatch, pgmb-maintenance); returns how many.
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

-- The loop's commit bounds, read from the settings pgmb.indb_commit_every (outcomes, 1 to
-- 10,000) and pgmb.indb_commit_ms (milliseconds, 0 to 60,000): ALTER DATABASE ... SET, or
-- ALTER ROLE, or SET in the calling session. The defaults are here and only here.
CREATE OR REPLACE FUNCTION pgmb.indb_commit_bounds(OUT commit_every integer, OUT commit_ms float8)
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

-- The transport pgmb.post uses: 'http' (the extension, under the default endpoint policy
-- only), 'plpython3u' (the PL/Python transport is installed) or NULL.
CREATE OR REPLACE FUNCTION pgmb.http_transport() RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    transport text;
BEGIN
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'http')
             AND pgmb.endpoint_policy_is_default() THEN 'http'
        WHEN to_regprocedure('pgmb.post_via_plpython(text, text, jsonb, float8)') IS NOT NULL THEN 'plpython3u'
    END INTO transport;
    RETURN transport;
END $$;

-- Writes the outcomes of requests, through pgmb.ack (2xx) and pgmb.fail (the others), in
-- one call each. Should that fail, each outcome is written on its own, so that one that
-- cannot be written does not undo the others; one that cannot is marked started instead
-- (pgmb.start): the request was made, so the expiry of its lease counts as an attempt.
-- Returns how many outcomes were written.
CREATE OR REPLACE FUNCTION pgmb.record_outcomes(delivery_ids bigint[], lease_ids uuid[], outcomes pgmb.http_outcome[])
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

-- The headers of one request (pgmb.run_headers of a one-request run).
CREATE OR REPLACE FUNCTION pgmb.request_headers(c pgmb.claimed, unix_time bigint)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (pgmb.run_headers(ARRAY[c], unix_time))[1];
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
    c pgmb.claimed;
    outcome pgmb.http_outcome;
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
                           array_agg(x.lease_id ORDER BY x.ordinality)
                    INTO run_urls, run_bodies, run_timeouts, run_ids, run_leases
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
                             last_post_ms, extract(epoch FROM deadline)::float8)
                         WITH ORDINALITY AS r(status, error, retry_after, duration_ms, finished, n);
                EXCEPTION WHEN others THEN
                    -- Not a request's fault (those are outcomes): the call's. Recorded against
                    -- the run's first row; the rest go on in the next run.
                    run_outcomes := ARRAY[ROW(NULL, 'could not send the request: ' || SQLERRM, NULL,
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
                BEGIN
                    -- Two statements, not one CASE: an expression naming pgmb.post_via_plpython
                    -- cannot even be planned where PL/Python is missing.
                    IF transport = 'plpython3u' THEN
                        outcome := pgmb.post_via_plpython(c.endpoint, c.body,
                                                          pgmb.request_headers(c, extract(epoch FROM now())::bigint), c.timeout);
                    ELSE
                        outcome := pgmb.post(c.endpoint, c.body,
                                             pgmb.request_headers(c, extract(epoch FROM now())::bigint), c.timeout);
                    END IF;
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

-- The headers of each request of a run, as pgmb/worker_request.py builds them: the
-- message's own headers (printable ASCII values of valid names, none reserved: the
-- names the transports set themselves, User-Agent included, are dropped whatever their case),
-- pgmb's, and a Standard Webhooks signature per signing secret (c.secrets). The header rule's
-- one SQL home.
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
                   'pgmb-routing-key', c.routing_key,
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

-- ==== pgmb/sql/schema/access.sql ====
-- Access control (docs/access.md): the roles pgmb_producer, pgmb_consumer and pgmb_admin,
-- queue grants, and the checks of the functions that act for their caller.

-- Roles are the cluster's: without CREATEROLE (a managed service's owner role) a DBA
-- creates them, then runs SELECT pgmb.install_access(); (docs/access.md). Migrating goes on
-- without them: `migrate` and `manage.py check` say what the DBA runs (pgmb.group_roles).
-- Since PostgreSQL 16 the role that creates them gets ADMIN OPTION on them, so it may hand
-- them out (pgmb.set_membership).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgmb_producer') THEN
        CREATE ROLE pgmb_producer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgmb_consumer') THEN
        CREATE ROLE pgmb_consumer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgmb_admin') THEN
        CREATE ROLE pgmb_admin NOLOGIN;
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'pgmb: the roles pgmb_producer, pgmb_consumer and pgmb_admin were not created (%)',
                 SQLERRM
        USING HINT = 'manage.py check --database default names the statements a DBA runs (docs/access.md).';
END $$;

-- Whether the current role may grant group_role (an existing role's oid) to other roles:
-- a superuser, or a role with ADMIN OPTION on it; before PostgreSQL 16, also a CREATEROLE
-- role, for a role that is not a superuser. Since 16, CREATEROLE alone no longer suffices
-- for a role it did not create. Reads only the catalogs.
CREATE OR REPLACE FUNCTION pgmb.may_grant_role(group_role oid) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT pg_has_role(current_user, group_role, 'MEMBER WITH ADMIN OPTION')
        OR (current_setting('server_version_num')::integer < 160000
            AND EXISTS (SELECT FROM pg_roles me WHERE me.rolname = current_user AND me.rolcreaterole)
            AND NOT EXISTS (SELECT FROM pg_roles g WHERE g.oid = group_role AND g.rolsuper))
$$;

-- The three group roles as the current role (the owner) sees them: whether each exists,
-- whether pgmb's grants were given to it (pgmb.apply_access: a direct grant on schema
-- pgmb), and whether the current role may hand it out (pgmb.may_grant_role). What
-- `manage.py check` reports, with the statements a DBA runs.
CREATE OR REPLACE FUNCTION pgmb.group_roles()
RETURNS TABLE (role_name name, present boolean, applied boolean, grantable boolean)
LANGUAGE sql STABLE AS $$
    SELECT g.name, r.oid IS NOT NULL,
           r.oid IS NOT NULL AND EXISTS (SELECT FROM pg_namespace n, aclexplode(n.nspacl) a
                                         WHERE n.nspname = 'pgmb' AND a.grantee = r.oid),
           r.oid IS NOT NULL AND pgmb.may_grant_role(r.oid)
    FROM unnest('{pgmb_producer,pgmb_consumer,pgmb_admin}'::name[]) WITH ORDINALITY AS g(name, n)
    LEFT JOIN pg_roles r ON r.rolname = g.name
    ORDER BY g.n
$$;

-- Every role may call into pgmb, so that a refusal is pgmb's own error, which says what
-- grant is missing. The functions that act for a role check it; the others run with the
-- caller's privileges, and those need privileges on the tables.
GRANT USAGE ON SCHEMA pgmb TO PUBLIC;

-- Which queues a role may consume, besides pgmb_admin's members. A grant to a role that
-- no longer exists matches nobody (roles are joined by name), nor does a grant of a queue
-- deleted since: there is no foreign key, because Django's flush truncates pgmb_queue
-- alone. grant_queue_access clears such leftovers.
CREATE TABLE IF NOT EXISTS pgmb.queue_grant (
    queue_id uuid NOT NULL,
    role_name name NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, role_name)
);
CREATE INDEX IF NOT EXISTS queue_grant_role ON pgmb.queue_grant (role_name);

-- The role a definer function acts for.
CREATE OR REPLACE FUNCTION pgmb.caller() RETURNS name
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('role'), 'none'), session_user)::name
$$;

-- Whether the caller is a member (with its privileges) of a group role that may not exist.
CREATE OR REPLACE FUNCTION pgmb.caller_in(group_role name) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT FROM pg_roles r
                   WHERE r.rolname = group_role AND pg_has_role(pgmb.caller(), r.oid, 'USAGE'))
$$;

-- Raises insufficient_privilege unless the caller may; the message names who and what.
-- Like pgmb.may, callable by anyone about themselves.
CREATE OR REPLACE FUNCTION pgmb.require(action text, queue_name text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    qid uuid;
BEGIN
    PERFORM pgmb.refuse_writable_schemas();
    IF action = 'consume' THEN
        SELECT q.id INTO qid FROM pgmb_queue q WHERE q.name = queue_name;
        -- Only a role that may consume every queue (pgmb.may without a queue) learns that
        -- one does not exist: to any other, a missing queue and a queue not granted to it
        -- get the same refusal below (docs/decisions/0039-refusals-tell-nothing.md).
        IF qid IS NULL AND pgmb.may('consume', NULL) THEN
            RAISE EXCEPTION 'queue % does not exist', quote_nullable(queue_name)
                USING ERRCODE = 'undefined_object',
                      HINT = 'SELECT name FROM pgmb.queues WHERE worker_id IS NULL lists the pull queues.';
        END IF;
    END IF;
    IF pgmb.may(action, qid) THEN
        RETURN;
    END IF;
    CASE action
    WHEN 'publish' THEN
        RAISE EXCEPTION 'role % may not publish', quote_ident(pgmb.caller())
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('An administrator grants it: SELECT pgmb.grant_publish_access(%L);', pgmb.caller());
    WHEN 'consume' THEN
        RAISE EXCEPTION 'role % may not consume queue %', quote_ident(pgmb.caller()), quote_nullable(queue_name)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('An administrator grants it: SELECT pgmb.grant_queue_access(%L, %L);',
                                queue_name, pgmb.caller());
    ELSE
        RAISE EXCEPTION 'role % may not administer pgmb', quote_ident(pgmb.caller())
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'An administrator grants it: GRANT pgmb_admin TO the role;';
    END CASE;
END $$;

-- The grants that make the three roles what they are, each skipped while its role does not
-- exist; the roles' names in the order they were missing. The migration runs it even where
-- other roles may create in pgmb's schemas (PostgreSQL 14's public, by default): the
-- definers refuse to act there anyway, and `manage.py check` says what to revoke.
CREATE OR REPLACE FUNCTION pgmb.apply_access() RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    missing text[] := '{}';
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['pgmb_producer', 'pgmb_consumer', 'pgmb_admin'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
            missing := missing || r;
            CONTINUE;
        END IF;
        EXECUTE format('GRANT USAGE ON SCHEMA pgmb TO %I', r);
    END LOOP;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgmb_admin') THEN
        -- pgmb's tables and sequences only: the schema holds the project's others too.
        FOR r IN
            SELECT format('GRANT %s ON %s TO pgmb_admin',
                          CASE c.relkind WHEN 'S' THEN 'USAGE, SELECT' ELSE 'SELECT, INSERT, UPDATE, DELETE' END,
                          c.oid::regclass)
            FROM pg_class c
            WHERE c.relnamespace = (SELECT t.relnamespace FROM pg_class t WHERE t.oid = 'pgmb_message'::regclass)
              AND c.relkind IN ('r', 'p', 'S', 'v') AND c.relname LIKE 'pgmb\_%'
        LOOP
            EXECUTE r;
        END LOOP;
        EXECUTE 'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgmb TO pgmb_admin';
        -- Every function of pgmb's, those that post and loop included, and what the owner
        -- makes in schema pgmb from now on (each queue's views, functions of later releases).
        EXECUTE 'GRANT EXECUTE ON ALL ROUTINES IN SCHEMA pgmb TO pgmb_admin';
        EXECUTE 'ALTER DEFAULT PRIVILEGES IN SCHEMA pgmb GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO pgmb_admin';
        EXECUTE 'ALTER DEFAULT PRIVILEGES IN SCHEMA pgmb GRANT EXECUTE ON ROUTINES TO pgmb_admin';
    END IF;
    RETURN missing;
END $$;

-- What a DBA runs after creating the roles (docs/access.md): pgmb.apply_access, refused
-- while other roles may create in pgmb's schemas, where a grant would hand out functions
-- that could be hijacked.
CREATE OR REPLACE FUNCTION pgmb.install_access() RETURNS text[]
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmb.refuse_writable_schemas();
    RETURN pgmb.apply_access();
END $$;

-- Membership of a group role is changed by the function's owner: the application's role,
-- which created the roles (or got ADMIN OPTION on them from a DBA). Refused with the
-- statement a DBA runs where it may not (PostgreSQL 16+ with CREATEROLE alone, roles a DBA
-- made), before anything is written.
CREATE OR REPLACE FUNCTION pgmb.set_membership(group_role name, role_name name, member boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = group_role) THEN
        RAISE EXCEPTION 'role % does not exist', group_role
            USING ERRCODE = 'undefined_object',
                  HINT = 'A DBA creates it (docs/access.md), then runs SELECT pgmb.install_access();';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = role_name) THEN
        RAISE EXCEPTION 'role % does not exist', quote_ident(role_name) USING ERRCODE = 'undefined_object';
    END IF;
    IF NOT pgmb.may_grant_role((SELECT oid FROM pg_roles WHERE rolname = group_role)) THEN
        RAISE EXCEPTION 'pgmb: role % may not grant or revoke %', quote_ident(current_user), group_role
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('A DBA (a superuser, or a role with ADMIN OPTION on %1$s) runs: GRANT %1$s TO %2$I WITH ADMIN OPTION;',
                                group_role, current_user);
    END IF;
    IF member THEN
        EXECUTE format('GRANT %I TO %I', group_role, role_name);
    ELSE
        EXECUTE format('REVOKE %I FROM %I', group_role, role_name);
    END IF;
END $$;

-- Makes a role a publisher: a member of pgmb_producer.
CREATE OR REPLACE FUNCTION pgmb.grant_publish_access(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmb.require('administer');
    PERFORM pgmb.set_membership('pgmb_producer', role_name, true);
END $$;

-- Takes a role out of pgmb_producer.
CREATE OR REPLACE FUNCTION pgmb.revoke_publish_access(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmb.require('administer');
    PERFORM pgmb.set_membership('pgmb_producer', role_name, false);
END $$;

-- Returns whether the grant is new.
CREATE OR REPLACE FUNCTION pgmb.grant_queue_access(queue_name text, role_name name) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    qid uuid;
    added integer;
BEGIN
    PERFORM pgmb.require('administer');
    SELECT q.id INTO qid FROM pgmb_queue q WHERE q.name = queue_name;
    IF qid IS NULL THEN
        RAISE EXCEPTION 'queue % does not exist', quote_literal(queue_name) USING ERRCODE = 'undefined_object';
    END IF;
    PERFORM pgmb.set_membership('pgmb_consumer', role_name, true);
    DELETE FROM pgmb.queue_grant g WHERE NOT EXISTS (SELECT FROM pgmb_queue q WHERE q.id = g.queue_id);
    INSERT INTO pgmb.queue_grant (queue_id, role_name) VALUES (qid, grant_queue_access.role_name)
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS added = ROW_COUNT;
    RETURN added > 0;
END $$;

-- Returns whether there was a grant; the role stays in pgmb_consumer while it has others.
CREATE OR REPLACE FUNCTION pgmb.revoke_queue_access(queue_name text, role_name name) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    removed integer;
BEGIN
    PERFORM pgmb.require('administer');
    IF NOT EXISTS (SELECT FROM pgmb_queue q WHERE q.name = queue_name) THEN
        RAISE EXCEPTION 'queue % does not exist', quote_literal(queue_name) USING ERRCODE = 'undefined_object';
    END IF;
    DELETE FROM pgmb.queue_grant g USING pgmb_queue q
    WHERE q.id = g.queue_id AND q.name = queue_name AND g.role_name = revoke_queue_access.role_name;
    GET DIAGNOSTICS removed = ROW_COUNT;
    IF NOT EXISTS (SELECT FROM pgmb.queue_grant g WHERE g.role_name = revoke_queue_access.role_name)
       AND EXISTS (SELECT FROM pg_roles WHERE rolname = revoke_queue_access.role_name) THEN
        PERFORM pgmb.set_membership('pgmb_consumer', role_name, false);
    END IF;
    RETURN removed > 0;
END $$;

-- The caller (pgmb.caller) may publish: it may insert messages itself, or it is a member of
-- pgmb_producer. Used from functions with a fixed search_path only (pgmb.may, pgmb.send).
-- Refuses first while the schemas are writable (pgmb.refuse_writable_schemas): pgmb.send
-- calls it before anything else.
CREATE OR REPLACE FUNCTION pgmb.may_publish() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN pgmb.refuse_writable_schemas()
                THEN has_table_privilege(pgmb.caller(), 'pgmb_message', 'INSERT') OR pgmb.caller_in('pgmb_producer')
           END
$$;

-- Whether the caller may read pgmb's messages (the owner, pgmb_admin's members, a role
-- granted SELECT on pgmb_message): only such a caller is told about messages it did not
-- publish, that an id is taken or that a dependency does not exist (pgmb.send,
-- pgmb.admit_message; docs/decisions/0039-refusals-tell-nothing.md).
CREATE OR REPLACE FUNCTION pgmb.caller_sees_messages() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT has_table_privilege(pgmb.caller(), 'pgmb_message', 'SELECT')
$$;

-- Whether the calling role may publish, consume the queue, or administer pgmb
-- (action 'publish', 'consume' or 'administer'), from its memberships, grants and
-- privileges. 'consume' without a queue id: whether it may consume every queue.
CREATE OR REPLACE FUNCTION pgmb.may(action text, queue_id uuid DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    who name;
BEGIN
    PERFORM pgmb.refuse_writable_schemas();
    who := pgmb.caller();
    CASE action
    WHEN 'publish' THEN
        RETURN pgmb.may_publish();
    WHEN 'consume' THEN
        RETURN has_table_privilege(who, 'pgmb_delivery', 'DELETE')
            OR EXISTS (SELECT FROM pgmb.queue_grant g JOIN pg_roles r ON r.rolname = g.role_name
                       WHERE g.queue_id = may.queue_id AND pg_has_role(who, r.oid, 'USAGE'));
    WHEN 'administer' THEN
        RETURN has_table_privilege(who, 'pgmb_queue', 'UPDATE');
    ELSE
        RAISE EXCEPTION 'unknown action %', quote_literal(action) USING ERRCODE = 'invalid_parameter_value';
    END CASE;
END $$;

-- The entry points: acting for their caller, pinned by pgmb.pin_definers (tables.sql).
-- Each queue's views are made by their owner, so that a pgmb_admin member who creates a
-- queue need not create in pgmb.
SELECT pgmb.pin_definers(ARRAY[
    'pgmb.may(text, uuid)', 'pgmb.require(text, text)',
    'pgmb.grant_publish_access(name)', 'pgmb.revoke_publish_access(name)',
    'pgmb.grant_queue_access(text, name)', 'pgmb.revoke_queue_access(text, name)',
    'pgmb.install_access()',
    'pgmb.create_queue_views(uuid, text)', 'pgmb.drop_queue_views(text)'
]);

-- Closed by default (docs/decisions/0025-closed-by-default-functions.md): no function of
-- pgmb's is executable by PUBLIC but the reviewed list below, the calls that check their
-- caller themselves. A function added to any schema file is closed until it is listed here
-- and in tests/security/test_privileges.py. The owner and pgmb_admin (pgmb.install_access)
-- execute everything: posting, the in-database loop, the transports, the state machine.
-- (ALTER DEFAULT PRIVILEGES IN SCHEMA cannot revoke what PUBLIC gets by default; this
-- statement, run last by every migration that runs the schema, is what closes them.)
REVOKE EXECUTE ON ALL ROUTINES IN SCHEMA pgmb FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    -- publishing (pgmb_producer): checks its caller
    pgmb.send(uuid, text, jsonb),
    pgmb.send(uuid, text, jsonb, jsonb),
    pgmb.send(uuid, text, jsonb, jsonb, integer),
    pgmb.send(uuid, text, jsonb, jsonb, timestamptz, integer, text, uuid[], text, integer, float8),
    -- pull queues (pgmb_consumer): each checks the queue grant
    pgmb.read(text, double precision, integer, jsonb),
    pgmb.read_with_poll(text, double precision, integer, double precision, integer, jsonb),
    pgmb.pop(text, integer),
    pgmb.delete(text, bigint[]), pgmb.delete(text, bigint),
    pgmb.archive(text, bigint[]), pgmb.archive(text, bigint),
    pgmb.set_vt(text, bigint[], double precision), pgmb.set_vt(text, bigint, double precision),
    pgmb.nack(text, bigint[], integer[], text[]),
    pgmb.purge(text), pgmb.pull_next_visible(text),
    -- about the caller itself, and grants that refuse with pgmb's own message
    pgmb.may(text, uuid), pgmb.require(text, text),
    pgmb.grant_publish_access(name), pgmb.revoke_publish_access(name),
    pgmb.grant_queue_access(text, name), pgmb.revoke_queue_access(text, name)
TO PUBLIC;

-- The roles' privileges on the tables, views and functions (where the roles exist).
SELECT pgmb.apply_access();
