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
