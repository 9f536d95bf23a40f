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
-- secrets that have not expired, the most recently retired first, at most
-- pgmb.max_retiring_secrets() of them (rows written past the bound, by a direct INSERT
-- say, sign nothing). An empty array: the requests are not signed. PL/pgSQL, so that its
-- query is planned once a session: an SQL function (never inlined, for its subquery) would
-- be parsed and planned at every claim.
CREATE OR REPLACE FUNCTION pgmb.signing_secrets(current text, worker_id uuid, at timestamptz)
RETURNS text[]
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN array_remove(ARRAY[current], '') || ARRAY(
        SELECT s.secret::text FROM pgmb_worker_secret s
        WHERE s.worker_id = signing_secrets.worker_id AND s.expires_at > at
        ORDER BY s.retired_at DESC, s.id DESC
        LIMIT pgmb.max_retiring_secrets());
END $$;

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
