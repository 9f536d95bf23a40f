-- Reverse of 0003_shared_rules: the definitions from before it (0001's) come back, then the functions 0003
-- added go. 0003's key class holds every character that 0001's [[:space:][:cntrl:]] refuses
-- (with glibc's classes), so validating 0001's CHECK again finds no bad row.

ALTER TABLE pgmb_message DROP CONSTRAINT pgmb_message_routing_key_valid;
ALTER TABLE pgmb_message
    ADD CONSTRAINT pgmb_message_routing_key_valid
        CHECK (routing_key <> '' AND routing_key !~ '[*#[:space:][:cntrl:]]');

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

DROP FUNCTION pgmb.secret_key(text);
DROP FUNCTION pgmb.secret_problem(text);
DROP FUNCTION pgmb.check_delay(float8);
DROP FUNCTION pgmb.valid_routing_key(text);
DROP FUNCTION pgmb.valid_key(text);
