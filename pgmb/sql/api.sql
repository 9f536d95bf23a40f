-- The SQL surface of the original pgmb extension, for producers that are not Django:
-- pgmb.worker, pgmb.create, the pgmb.send overloads and the monitoring views.

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

-- The documented argument order: (name, binding_key, max_retries, worker_id).
CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, max_retries integer, worker_id uuid)
RETURNS uuid
LANGUAGE plpgsql AS $$
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

-- The order the seed's Quick Start uses: (name, binding_key, worker_id, max_retries).
CREATE OR REPLACE FUNCTION pgmb.create(name text, binding_key text, worker_id uuid, max_retries integer)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT pgmb.create(name, binding_key, max_retries, worker_id) $$;

-- Every send returns the message id (the seed returned void; an id is strictly more useful).
CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb, delay timestamptz)
RETURNS uuid
LANGUAGE plpgsql AS $$
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION 'a message id is required' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'Pass gen_random_uuid() for a new id.';
    END IF;
    PERFORM pgmb.check_routing_key(routing_key);
    IF body IS NULL THEN
        RAISE EXCEPTION 'a message body is required (JSON null is ''null''::jsonb)'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'message headers must be a JSON object, not %', jsonb_typeof(headers)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM pgmb_message m WHERE m.id = send.id) THEN
        RAISE EXCEPTION 'message % already exists', send.id
            USING ERRCODE = 'unique_violation',
                  HINT = 'Message ids are unique; pass gen_random_uuid() for a new message.';
    END IF;
    INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at)
    VALUES (send.id, send.routing_key, send.body, coalesce(send.headers, '{}'), now(),
            greatest(coalesce(send.delay, now()), now()));
    RETURN send.id;
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

CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb, headers jsonb)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT pgmb.send(id, routing_key, body, headers, NULL::timestamptz) $$;

CREATE OR REPLACE FUNCTION pgmb.send(id uuid, routing_key text, body jsonb)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT pgmb.send(id, routing_key, body, NULL::jsonb, NULL::timestamptz) $$;

-- Monitoring views. Secrets are never shown.

CREATE OR REPLACE VIEW pgmb.workers AS
SELECT w.id, w.name, w.endpoint, w.rps, w.timeout, w.active, (w.secret <> '') AS signed, w.created_at
FROM pgmb_worker w;

CREATE OR REPLACE VIEW pgmb.queues AS
SELECT q.id, q.name, q.binding_key, q.pattern, q.worker_id, w.name AS worker, q.max_retries,
       q.backoff_base, q.backoff_max, q.lease_seconds, q.paused,
       (SELECT count(*) FROM pgmb_delivery d WHERE d.queue_id = q.id) AS pending,
       (SELECT count(*) FROM pgmb_dead_letter x WHERE x.queue_id = q.id) AS dead_letters,
       q.created_at
FROM pgmb_queue q JOIN pgmb_worker w ON w.id = q.worker_id;

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
       CASE WHEN d.available_at <= now() THEN 'ready'
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

CREATE OR REPLACE VIEW pgmb.dead_letter_entries AS
SELECT x.queue_id, q.name AS queue, x.message_id, m.routing_key, m.body, m.headers,
       x.attempts, x.last_status, x.last_error, x.created_at AS dead_at, m.created_at
FROM pgmb_dead_letter x
JOIN pgmb_queue q ON q.id = x.queue_id
JOIN pgmb_message m ON m.id = x.message_id;

SELECT pgmb.refresh_queue_views();
