-- pgmb 0019: routing stays cheap with many queues.
--
-- The routing join tested every new message against every queue: a binding whose first
-- word is literal was ruled out by comparing first words (~0.2 us each), any other ran
-- its regex, and PostgreSQL keeps only 32 compiled regexes per backend, so past that each
-- test compiled its pattern again. With 1,000 queues bound (a third each `svc.*.#`,
-- `*.svc.created`, `#.svc`) a message took ~7 ms to route: 0.003 of the rate with 5 queues
-- (bench/scale.py). Every literal word of a binding (neither `*` nor `#`) must be a word of
-- any routing key it matches, so the queues whose literal words are all among the key's
-- words are the only candidates: a GIN index of each queue's literal words finds them, and
-- only they reach the first-word test and the regex.

-- The words of a binding key that are neither '*' nor '#' (duplicates kept: harmless).
CREATE FUNCTION pgmb.binding_literals(binding_key text) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(word), '{}')
    FROM unnest(string_to_array(binding_key, '.')) AS word
    WHERE word NOT IN ('*', '#')
$$;

ALTER TABLE pgmb_queue ADD COLUMN literal_words text[] NOT NULL DEFAULT '{}';

-- As in 0004, and the literal words derived with the pattern, from the binding key.
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
