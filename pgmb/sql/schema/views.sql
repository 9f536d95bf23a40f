-- The monitoring views of the SQL API (secrets are never shown), and each queue's own pair
-- of views, pgmb.<stem>_queue and pgmb.<stem>_dead_letter_queue, which the queue_views
-- trigger of pgmb_queue keeps with pgmb.create_queue_views and pgmb.drop_queue_views.

-- An endpoint as it may be shown: the user name and password of the URL each replaced by
-- *** ('***:***' with a password, '***' without; the last '@' before the path ends them),
-- the scheme in lower case; a URL without them as it is. The masking of
-- pgmb.endpoint_masking.mask_credentials (tests/rules/test_credentials_mask.py: one table of
-- cases for both; docs/decisions/0028-secrets-stay-secret-in-the-admin.md).
CREATE OR REPLACE FUNCTION pgmb.mask_credentials(url text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
SELECT CASE
    WHEN m IS NULL THEN url
    ELSE lower(m[1]) || CASE WHEN strpos(m[2], ':') > 0 THEN '***:***' ELSE '***' END
         || '@' || m[3]
END
FROM (SELECT regexp_match(url, '^([A-Za-z][A-Za-z0-9+.-]*://)([^/?#]*)@(.*)$') AS m) AS parsed
$$;

-- The workers, with whether they sign their requests (by their secret or a retiring one,
-- pgmb.signing_secrets) instead of their secrets, and their endpoints' credentials masked.
CREATE OR REPLACE VIEW pgmb.workers AS
SELECT w.id, w.name, pgmb.mask_credentials(w.endpoint) AS endpoint, w.rps, w.timeout, w.active,
       cardinality(pgmb.signing_secrets(w.secret, w.id, now())) > 0 AS signed, w.created_at
FROM pgmb_worker w;

-- The queues with their counts of live deliveries and dead letters; a pull queue has no
-- worker (worker_id and worker NULL).
CREATE OR REPLACE VIEW pgmb.queues AS
SELECT q.id, q.name, q.binding_key, q.pattern, q.worker_id, w.name AS worker, q.max_retries,
       q.backoff_base, q.backoff_max, q.lease_seconds, q.paused,
       (SELECT count(*) FROM pgmb_delivery d WHERE d.queue_id = q.id) AS pending,
       (SELECT count(*) FROM pgmb_dead_letter x WHERE x.queue_id = q.id) AS dead_letters,
       q.created_at
FROM pgmb_queue q LEFT JOIN pgmb_worker w ON w.id = q.worker_id;

-- The messages, and whether any queue took them (routed).
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
       CASE WHEN d.state = 'waiting' THEN 'waiting'
            WHEN d.available_at <= now() THEN 'ready'
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

-- The dead letters of every queue, with their messages.
CREATE OR REPLACE VIEW pgmb.dead_letter_entries AS
SELECT x.queue_id, q.name AS queue, x.message_id, m.routing_key, m.body, m.headers,
       x.attempts, x.last_status, x.last_error, x.created_at AS dead_at, m.created_at
FROM pgmb_dead_letter x
JOIN pgmb_queue q ON q.id = x.queue_id
JOIN pgmb_message m ON m.id = x.message_id;

-- Creates (or replaces) a queue's views: pgmb.<stem>_queue over pgmb.queue_entries and
-- pgmb.<stem>_dead_letter_queue over pgmb.dead_letter_entries. Both functions run as their
-- owner (SECURITY DEFINER, set in access.sql), who owns the views, so that whoever may
-- create a queue (pgmb_admin) need not create in schema pgmb.
CREATE OR REPLACE FUNCTION pgmb.create_queue_views(queue_id uuid, queue_name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    closed boolean := pgmb.refuse_writable_schemas();  -- first (tables.sql)
    base text := pgmb.view_base(queue_name);
BEGIN
    EXECUTE format('CREATE OR REPLACE VIEW pgmb.%I AS SELECT * FROM pgmb.queue_entries WHERE queue_id = %L',
                   base || '_queue', queue_id);
    EXECUTE format('CREATE OR REPLACE VIEW pgmb.%I AS SELECT * FROM pgmb.dead_letter_entries WHERE queue_id = %L',
                   base || '_dead_letter_queue', queue_id);
END $$;

-- Drops a queue's two views (a queue deleted or renamed).
CREATE OR REPLACE FUNCTION pgmb.drop_queue_views(queue_name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    closed boolean := pgmb.refuse_writable_schemas();  -- first (tables.sql)
    base text := pgmb.view_base(queue_name);
BEGIN
    EXECUTE format('DROP VIEW IF EXISTS pgmb.%I, pgmb.%I', base || '_queue', base || '_dead_letter_queue');
END $$;

-- Re-creates every queue's views, after the generic views they select from changed.
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

-- Each queue's views select from the generic ones above: re-made whenever those change.
SELECT pgmb.refresh_queue_views();
