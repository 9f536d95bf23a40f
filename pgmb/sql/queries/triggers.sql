-- Bodies of the triggers that pgmb.models declares with django-pgtrigger (the part between
-- BEGIN and END). They stay short: the logic lives in functions of schema pgmb.

-- name: worker_validate
RETURN pgmb.prepare_worker(NEW);

-- name: worker_timeout
PERFORM pgmb.check_worker_timeout(NEW);
RETURN NEW;

-- name: queue_prepare
RETURN pgmb.prepare_queue(NEW);

-- name: queue_views
IF TG_OP <> 'INSERT' AND (TG_OP = 'DELETE' OR OLD.name IS DISTINCT FROM NEW.name) THEN
    PERFORM pgmb.drop_queue_views(OLD.name);
END IF;
IF TG_OP = 'DELETE' THEN
    -- Deliveries have no FK to their queue (it made every publish lock the queue's row):
    -- a queue deleted in plain SQL takes its deliveries and dead letters with it here.
    DELETE FROM pgmb_delivery WHERE queue_id = OLD.id;
    DELETE FROM pgmb_dead_letter WHERE queue_id = OLD.id;
ELSE
    PERFORM pgmb.create_queue_views(NEW.id, NEW.name);
END IF;
RETURN NULL;

-- name: route_messages
-- The statement's routing keys, bodies and headers pass their rules first (routing.sql,
-- pgmb.message_problem): here, not as a CHECK, whose
-- expression PostgreSQL would prepare again for every INSERT; this statement is planned once
-- per session.
PERFORM pgmb.refuse_message(m.id, m.routing_key, m.body, m.headers) FROM new_messages AS m
WHERE NOT (pgmb.valid_routing_key(m.routing_key) AND pgmb.acceptable_message(m.body, m.headers)) LIMIT 1;
-- One INSERT routes the whole statement's messages; a NOTIFY, if some dispatcher waits for
-- one (pgmb.wake_dispatchers), wakes dispatchers once at commit (identical notifications
-- in a transaction are merged).
-- A delivery with a group or dependencies may be made 'waiting' by pgmb.hold_delivery.
-- A queue with a fairness header gets the header's value as the key (fairness.sql). Its
-- expiry is the earlier of its message's and its queue's message_ttl after publication
-- (least() skips NULLs: neither set, none). A delivery with a unique key is left out where
-- one with its key is live (pgmb.admit_unique_delivery).
INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at, created_at,
                           priority, group_key, depends_on, fair_key, expires_at, unique_key)
SELECT m.id, r.queue_id, 'ready', 0, m.available_at, m.created_at, m.priority, m.group_key,
       m.depends_on, pgmb.delivery_fair_key(r.fairness_header, m.headers),
       least(m.expires_at, m.created_at + r.message_ttl * interval '1 second'), m.unique_key
-- Each message's place in the statement: deliveries are inserted in publish order, which
-- their ids keep and ordered groups follow (pgmb.hold_delivery); the join below may return
-- them in any order.
FROM (SELECT n.id, n.routing_key, n.available_at, n.created_at, n.priority, n.group_key,
             n.depends_on, n.dedup_id, n.headers, n.expires_at, n.unique_key,
             row_number() OVER () AS place
      FROM new_messages AS n) AS m
-- The queues of each distinct key, decided once per key: a batch's messages mostly
-- share a few keys. OFFSET 0 keeps the planner from joining the messages in first, which
-- would compute the key's tags and test the queues once per message again.
JOIN (SELECT k.routing_key, q.id AS queue_id, q.dedup_window, q.pattern, q.fairness_header,
             q.message_ttl
      FROM (SELECT DISTINCT n.routing_key FROM new_messages AS n) AS k
      -- The key's tags (pgmb.key_tags): OFFSET 0 keeps the subquery a step
      -- of its own, where inlined into the join condition a scan of a few queues would
      -- compute them once per queue.
      CROSS JOIN LATERAL (SELECT pgmb.key_tags(k.routing_key) AS tags OFFSET 0) AS t
      -- Only a queue whose binding's tags are all tags of the key can match, so few queues
      -- reach the regex (PostgreSQL caches only 32 compiled regexes per backend; past that
      -- every match compiles its pattern again). With many queues the first test is a
      -- lookup in the GIN index pgmb_queue_binding_tags. With a few, scanned, the CASE
      -- makes the cheap test run first: the regex alone needs only k and q, and the planner
      -- would otherwise run it on every pair before joining t.
      JOIN pgmb_queue AS q
        ON q.binding_tags <@ t.tags
       AND CASE WHEN q.binding_tags <@ t.tags THEN ('.' || k.routing_key) ~ q.pattern END
      OFFSET 0) AS r ON r.routing_key = m.routing_key
-- Not to a queue for which the message is a duplicate (pgmb.admit_message dropped those
-- that duplicate for every queue): one published before it, not later in this statement.
WHERE m.dedup_id IS NULL OR r.dedup_window = 0 OR NOT EXISTS (
    SELECT FROM pgmb.duplicated(r.dedup_window, r.pattern, m.id, m.dedup_id, m.created_at) AS x(id)
    WHERE NOT EXISTS (SELECT FROM (SELECT l.id, row_number() OVER () AS place FROM new_messages AS l) AS later
                      WHERE later.id = x.id AND later.place > m.place))
ORDER BY m.place;
IF FOUND THEN
    PERFORM pgmb.wake_dispatchers();
END IF;
RETURN NULL;

-- name: check_routing_key_update
-- Only an UPDATE that gives a message a key the rule rejects gets here (the trigger's WHEN):
-- pgmb never changes a key, but the rule holds for every writer.
PERFORM pgmb.refuse_routing_key(NEW.routing_key);
RETURN NEW;

-- name: admit_message
-- Only messages with an option other than priority, a unique key, or a time
-- pgmb.valid_time rejects, get here (the trigger's WHEN).
RETURN pgmb.admit_message(NEW);

-- name: hold_delivery
-- Only deliveries with a group or dependencies get here (the trigger's WHEN).
RETURN pgmb.hold_delivery(NEW);

-- name: admit_unique_key
-- Only deliveries with a unique key get here (the trigger's WHEN).
RETURN pgmb.admit_unique_delivery(NEW);

-- name: release_after_delivery
-- Only deliveries with a group, or that other messages depend on, get here.
PERFORM pgmb.release_after(OLD);
RETURN NULL;

-- name: release_after_dead_letter
PERFORM pgmb.release_dependents(OLD.message_id);
RETURN NULL;

-- name: worker_retire_secret
-- Only an UPDATE that changes the secret gets here (the trigger's WHEN).
PERFORM pgmb.retire_secret(NEW.id, OLD.secret, NEW.secret);
RETURN NULL;

-- name: check_message_update
-- Only an UPDATE that gives a message a body or headers the limits reject gets here (the
-- trigger's WHEN): the rule route_messages holds for inserts, for every writer.
PERFORM pgmb.refuse_message(NEW.id, NEW.routing_key, NEW.body, NEW.headers);
RETURN NEW;

-- name: check_message_times
-- Only a row with a time pgmb.valid_time rejects gets here (the trigger's WHEN).
PERFORM pgmb.refuse_expiry(NEW);
PERFORM pgmb.refuse_times('pgmb_message', NEW.id::text, NEW.created_at, NEW.available_at);
RETURN NEW;

-- name: check_delivery_times
-- Only a row with a time pgmb.valid_time rejects gets here (the trigger's WHEN).
PERFORM pgmb.refuse_times('pgmb_delivery', NEW.id::text, NEW.created_at, NEW.available_at);
RETURN NEW;
