-- Reverse of 0028_routing_tags: the literal words of 0019 again, prepare_queue as 0019 left
-- it and admit_message as 0026 did. Django puts the routing trigger of 0025 back first.
-- The words of a binding key that are neither '*' nor '#' (duplicates kept: harmless).
CREATE FUNCTION pgmb.binding_literals(binding_key text) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(word), '{}')
    FROM unnest(string_to_array(binding_key, '.')) AS word
    WHERE word NOT IN ('*', '#')
$$;

ALTER TABLE pgmb_queue ADD COLUMN literal_words text[] NOT NULL DEFAULT '{}';

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
    q.literal_words := pgmb.binding_literals(q.binding_key);
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
    RETURN q;
END $$;

UPDATE pgmb_queue SET literal_words = pgmb.binding_literals(binding_key);

CREATE INDEX pgmb_queue_literal_words ON pgmb_queue USING gin (literal_words);

CREATE OR REPLACE FUNCTION pgmb.admit_message(m pgmb_message) RETURNS pgmb_message
LANGUAGE plpgsql AS $$
DECLARE
    missing uuid;
    window_seconds float8;
    problem text := pgmb.message_options_problem(m.id, m.priority, m.group_key, m.depends_on,
                                                 m.dedup_id, m.max_retries, m.retry_delay);
BEGIN
    -- What the CHECK pgmb_message_options_valid enforced until 0026, with its name and code.
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'message % refused by pgmb_message_options_valid: %', m.id, problem
            USING ERRCODE = 'check_violation', CONSTRAINT = 'pgmb_message_options_valid';
    END IF;
    IF m.depends_on IS NOT NULL THEN
        SELECT dep INTO missing FROM unnest(m.depends_on) AS dep
        WHERE NOT EXISTS (SELECT FROM pgmb_message x WHERE x.id = dep) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'message % depends on message %, which does not exist', m.id, missing
                USING ERRCODE = 'foreign_key_violation',
                      HINT = 'Publish the messages it depends on first (earlier in the same batch is fine).';
        END IF;
    END IF;
    IF m.dedup_id IS NOT NULL THEN
        -- Concurrent publishers of one dedup id take turns; the second sees the first.
        PERFORM pg_advisory_xact_lock(hashtextextended('pgmb dedup ' || m.dedup_id, 0));
        SELECT max(q.dedup_window) INTO window_seconds FROM pgmb_queue q
        WHERE q.literal_words <@ string_to_array(m.routing_key, '.')
          AND ('.' || m.routing_key) ~ q.pattern;
        IF window_seconds > 0 AND EXISTS (
            SELECT FROM pgmb_message x
            WHERE x.dedup_id = m.dedup_id AND x.id <> m.id
              AND x.created_at > coalesce(m.created_at, now()) - window_seconds * interval '1 second') THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN m;
END $$;

DROP INDEX pgmb_queue_binding_tags;
ALTER TABLE pgmb_queue DROP COLUMN binding_tags;
DROP FUNCTION pgmb.key_tags(text);
DROP FUNCTION pgmb.binding_tags(text);
