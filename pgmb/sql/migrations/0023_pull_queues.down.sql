-- Reverse of 0023_pull_queues. Pull queues cannot go back to a schema where every queue
-- has a worker: delete them first (or give them a worker).
DO $$
DECLARE
    pull text;
BEGIN
    SELECT string_agg(quote_literal(name), ', ' ORDER BY name) INTO pull FROM pgmb_queue WHERE worker_id IS NULL;
    IF pull IS NOT NULL THEN
        RAISE EXCEPTION 'cannot migrate pgmb back before 0023: pull queues exist (%)', pull
            USING ERRCODE = 'object_in_use',
                  HINT = 'Delete those queues, or give each a worker, first.';
    END IF;
END $$;

DROP FUNCTION pgmb.pull_next_visible(text);
DROP FUNCTION pgmb.purge(text);
DROP FUNCTION pgmb.nack(text, bigint[], integer[], text[]);
DROP FUNCTION pgmb.set_vt(text, bigint, double precision);
DROP FUNCTION pgmb.set_vt(text, bigint[], double precision);
DROP FUNCTION pgmb.archive(text, bigint);
DROP FUNCTION pgmb.archive(text, bigint[]);
DROP FUNCTION pgmb.delete(text, bigint);
DROP FUNCTION pgmb.delete(text, bigint[]);
DROP FUNCTION pgmb.pop(text, integer);
DROP FUNCTION pgmb.settle_reads(text, bigint[], text);
DROP FUNCTION pgmb.read_with_poll(text, double precision, integer, double precision, integer, jsonb);
DROP FUNCTION pgmb.read(text, double precision, integer, jsonb);
DROP FUNCTION pgmb.check_pull_ids(text, uuid, bigint[]);
DROP FUNCTION pgmb.check_pull_args(double precision, integer, jsonb);
DROP FUNCTION pgmb.pull_queue(text);
DROP TYPE pgmb.pull_message;

CREATE OR REPLACE FUNCTION pgmb.metrics_all() RETURNS SETOF pgmb.queue_metrics
LANGUAGE sql STABLE AS $$
    SELECT q.name::text,
           r.n + coalesce(l.n, 0),
           r.due,
           extract(epoch FROM now() - greatest(r.newest, l.newest))::float8,
           extract(epoch FROM now() - r.oldest_due)::float8,
           r.n + coalesce(l.n, 0) + x.n + a.n,
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
        SELECT d.queue_id, count(*) AS n, max(d.created_at) AS newest
        FROM pgmb_delivery d WHERE d.state = 'leased' GROUP BY d.queue_id
    ) l ON l.queue_id = q.id
    LEFT JOIN (
        SELECT a.queue_id,
               count(*) FILTER (WHERE a.outcome = 'ack') AS delivered,
               count(*) FILTER (WHERE a.outcome NOT IN ('ack', 'unsent')) AS failed
        FROM pgmb_attempt a WHERE a.created_at > now() - interval '1 hour' GROUP BY a.queue_id
    ) h ON h.queue_id = q.id
    ORDER BY q.name
$$;

CREATE OR REPLACE VIEW pgmb.queues AS
SELECT q.id, q.name, q.binding_key, q.pattern, q.worker_id, w.name AS worker, q.max_retries,
       q.backoff_base, q.backoff_max, q.lease_seconds, q.paused,
       (SELECT count(*) FROM pgmb_delivery d WHERE d.queue_id = q.id) AS pending,
       (SELECT count(*) FROM pgmb_dead_letter x WHERE x.queue_id = q.id) AS dead_letters,
       q.created_at
FROM pgmb_queue q JOIN pgmb_worker w ON w.id = q.worker_id;

CREATE OR REPLACE FUNCTION pgmb.wake_dispatchers() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('pgmb.notify', true), '') = 'off' THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed'
       OR EXISTS (SELECT FROM pgmb_dispatcher d
                  WHERE d.kind = 'external' AND d.waiting IS NOT false
                    -- A killed dispatcher's mark would make publishers notify for ever.
                    AND pgmb.dispatcher_state(d.heartbeat_at, d.stopped_at) = 'running') THEN
        PERFORM pg_notify('pgmb', '');
    END IF;
END $$;

CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, max_retries integer, worker_id uuid)
RETURNS uuid LANGUAGE plpgsql AS $$
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

DELETE FROM pgmb_dispatcher WHERE kind = 'consumer';
ALTER TABLE pgmb_dispatcher DROP CONSTRAINT pgmb_dispatcher_kind;
ALTER TABLE pgmb_dispatcher ADD CONSTRAINT pgmb_dispatcher_kind
    CHECK (kind = 'external' OR kind = 'in_database');

ALTER TABLE pgmb_queue ALTER COLUMN worker_id SET NOT NULL;
