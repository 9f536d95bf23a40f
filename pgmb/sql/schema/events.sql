-- Operational events (docs/operations.md, Events; docs/decisions/0085-operational-events.md):
-- pgmb publishes messages of its own, under routing keys that begin with `pgmb.`, when a
-- delivery is dead-lettered (pgmb.dead_lettered), when a worker's circuit breaker opens or
-- closes (pgmb.breaker.opened, pgmb.breaker.closed) and when a delivery expires
-- (pgmb.expired). A queue bound to `pgmb.#` gets them all and can page someone. Off by
-- default.
--
-- Whether they are published is one row of pgmb.event_settings, read only where an event
-- would be published (a dead letter, a breaker's transition): the paths where nothing dies
-- read nothing more. A row, not a setting of the session: `manage.py pgmb_events on`
-- reaches the dispatchers already running, at their next statement.
--
-- Never recursive: an event about a delivery of a message whose routing key is under `pgmb.`
-- (an event's own delivery dying) is not published.
--
-- Publishing an event inserts one message, which the routing trigger routes as any other:
-- new rows of pgmb_message and pgmb_delivery, no lock on a row that exists already, so it
-- waits for no other transaction's delivery or worker rows (a settle or a claim holds those):
-- no deadlock with routing or with other dispatchers (tests/dispatch/test_events.py runs
-- several). The functions that publish run as their caller: the owner, a pgmb_admin member
-- (a dispatcher), or the owner again inside a definer (pgmb.nack of a consumer role); each
-- may insert messages.

-- The switch: one row, off until `manage.py pgmb_events on` (pgmb.set_events).
CREATE TABLE IF NOT EXISTS pgmb.event_settings (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    enabled boolean NOT NULL DEFAULT false
);
INSERT INTO pgmb.event_settings DEFAULT VALUES ON CONFLICT DO NOTHING;

-- Whether events are published.
CREATE OR REPLACE FUNCTION pgmb.events_enabled() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT s.enabled FROM pgmb.event_settings s), false)
$$;

-- Turn events on or off (`manage.py pgmb_events`); returns the new state.
CREATE OR REPLACE FUNCTION pgmb.set_events(enabled boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF enabled IS NULL THEN
        RAISE EXCEPTION 'events are on (true) or off (false), not NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    INSERT INTO pgmb.event_settings AS s (one, enabled) VALUES (true, set_events.enabled)
    ON CONFLICT (one) DO UPDATE SET enabled = excluded.enabled;
    RETURN enabled;
END $$;

-- Publish an event: a message with this routing key (under `pgmb.`) and body, routed as any
-- other. Nothing when events are off (returns NULL); else the message's id. The function the
-- other parts of pgmb call (expiry publishes pgmb.expired through it).
CREATE OR REPLACE FUNCTION pgmb.publish_event(routing_key text, body jsonb) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    id uuid;
BEGIN
    IF NOT starts_with(coalesce(routing_key, ''), 'pgmb.') THEN
        RAISE EXCEPTION 'invalid event routing key %: pgmb''s events are under pgmb.', quote_nullable(routing_key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT pgmb.events_enabled() THEN
        RETURN NULL;
    END IF;
    id := pgmb.uuid_v7();
    INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at, priority)
    VALUES (id, routing_key, coalesce(body, 'null'::jsonb), '{}', now(), now(), 0);
    RETURN id;
END $$;

-- An event about a delivery of a message on a queue (pgmb.dead_lettered, pgmb.expired):
-- body {queue, worker (NULL for a pull queue), message_id, routing_key} and `details`'
-- keys. Nothing when events are off, nor for a message whose routing key is under `pgmb.`
-- (never recursive), nor for a message or queue gone meanwhile. Returns whether one was
-- published. Expiry calls it with 'pgmb.expired'.
CREATE OR REPLACE FUNCTION pgmb.delivery_event(routing_key text, message_id uuid, queue_id uuid, details jsonb)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    body jsonb;
BEGIN
    IF NOT pgmb.events_enabled() THEN
        RETURN false;
    END IF;
    SELECT jsonb_build_object('queue', q.name, 'worker', w.name, 'message_id', m.id,
                              'routing_key', m.routing_key) || coalesce(details, '{}')
    INTO body
    FROM pgmb_message m
    JOIN pgmb_queue q ON q.id = delivery_event.queue_id
    LEFT JOIN pgmb_worker w ON w.id = q.worker_id
    WHERE m.id = delivery_event.message_id AND NOT starts_with(m.routing_key, 'pgmb.');
    IF body IS NULL THEN
        RETURN false;
    END IF;
    RETURN pgmb.publish_event(routing_key, body) IS NOT NULL;
END $$;

-- The event of a dead letter (pgmb.delivery_event's pgmb.dead_lettered, with its attempts
-- and last outcome). Called per dead letter where deliveries die (pgmb.settle_failures,
-- pgmb.nack, pgmb.read), only for those.
CREATE OR REPLACE FUNCTION pgmb.dead_letter_event(message_id uuid, queue_id uuid, attempts integer,
                                                  last_status integer, last_error text)
RETURNS boolean
LANGUAGE sql AS $$
    SELECT pgmb.delivery_event('pgmb.dead_lettered', message_id, queue_id,
                               jsonb_build_object('attempts', attempts, 'last_status', last_status,
                                                  'last_error', last_error))
$$;
