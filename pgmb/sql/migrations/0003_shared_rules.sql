-- pgmb 0003: one rule, one source. Every rule that pgmb checks both in Python (forms and the
-- Python API, for readable errors) and in SQL (for producers that are not Django) is
-- written once in words, next to its Python implementation, and the SQL below implements
-- the very same rule, with the same regex text where there is a regex.
-- tests/rules/test_shared_rules.py runs one table of inputs per rule through both sides.
--
--   keys        pgmb/routing.py            pgmb.valid_key, pgmb.check_key, the message CHECK
--   endpoints   pgmb/models.py             pgmb.prepare_worker
--   secrets     pgmb/dispatch/request.py   pgmb.secret_problem, pgmb.secret_key
--   delays      pgmb/durations.py          pgmb.check_delay
--   Retry-After pgmb/dispatch/client.py    pgmb.retry_after_seconds

-- ==== keys ====

-- A routing or binding key: non-empty, at most 255 characters, and none of the blanks and
-- control characters of this class (pgmb.routing.KEY_FORBIDDEN, the same text): ASCII
-- controls and space, DEL and the C1 controls, the other Unicode whitespace of Python's
-- str.isspace(), and U+FEFF.
CREATE OR REPLACE FUNCTION pgmb.valid_key(key text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT key <> '' AND length(key) <= 255
             AND key !~ '[\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]' $$;

-- A routing key: a valid key without the wildcards '*' and '#'.
CREATE OR REPLACE FUNCTION pgmb.valid_routing_key(routing_key text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT pgmb.valid_key(routing_key) AND routing_key !~ '[*#]' $$;

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

-- NOT VALID: upgrading does not scan pgmb_message; rows written from now on are checked.
ALTER TABLE pgmb_message DROP CONSTRAINT pgmb_message_routing_key_valid;
ALTER TABLE pgmb_message
    ADD CONSTRAINT pgmb_message_routing_key_valid CHECK (pgmb.valid_routing_key(routing_key)) NOT VALID;

-- ==== delays ====

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

CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb, delay integer)
RETURNS uuid
LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgmb.send(id, routing_key, body, headers,
                     now() + make_interval(secs => coalesce(pgmb.check_delay(delay), 0)));
END $$;

-- ==== secrets ====

-- What breaks the secret rule (pgmb/dispatch/request.py says it in words), or NULL when the
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

-- ==== catalog ====

-- The endpoint rule is pgmb.models.ENDPOINT_PATTERN, the same text; it now refuses every
-- blank and control character of the key rule. The endpoint and secret rules apply to the
-- values that enter: a worker whose stored value broke them before this migration keeps
-- working (pgmb.claim updates its row) until that value is changed.
CREATE OR REPLACE FUNCTION pgmb.prepare_worker(w pgmb_worker) RETURNS pgmb_worker
LANGUAGE plpgsql AS $$
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
    RETURN w;
END $$;

-- Workers already holding a secret that cannot sign: say so now, not at the first delivery.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT name, pgmb.secret_problem(secret) AS problem FROM pgmb_worker
             WHERE pgmb.secret_problem(secret) IS NOT NULL ORDER BY name LOOP
        RAISE WARNING 'pgmb: the secret of worker % cannot sign requests: %', r.name, r.problem
            USING HINT = 'Give it a new secret (in the admin, or UPDATE pgmb_worker SET secret = ...).';
    END LOOP;
END $$;

-- ==== dispatch ====

-- As in 0001, but the key comes from pgmb.secret_key(): unpadded base64 works, and a
-- secret that breaks the rule is reported as such (not as "invalid base64 end sequence").
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
                   pgmb.secret_key(c.secret),
                   convert_to(c.message_id::text || '.' || unix_time || '.' || c.body, 'UTF8')), 'base64'))
           END
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
