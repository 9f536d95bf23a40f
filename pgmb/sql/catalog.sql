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
