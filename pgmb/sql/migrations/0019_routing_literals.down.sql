-- Reverse of 0019_routing_literals: prepare_queue as 0004 left it. Django puts the routing
-- trigger of 0017 back first.
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
    -- NaN compares above every number here, so these also refuse it.
    IF q.lease_seconds > 2592000 OR q.backoff_base > 2592000 OR q.backoff_max > 2592000 THEN
        RAISE EXCEPTION 'invalid durations for queue %: the lease and the backoff may be at most 30 days (2592000 s)', q.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN q;
END $$;

DROP INDEX pgmb_queue_literal_words;
ALTER TABLE pgmb_queue DROP COLUMN literal_words;
DROP FUNCTION pgmb.binding_literals(text);
