-- Design limit: the rows pgmb writes for 100 routed messages (a message and its delivery
-- each) in one plain statement, into copies of pgmb_message and pgmb_delivery with the
-- same indexes, constraints and defaults and no triggers: no routing, no rules.
WITH m AS (
    INSERT INTO bench_limit_message (routing_key, body)
    SELECT (:keys::text[])[1 + g % 3], :body::jsonb
    FROM generate_series(1, 100) AS g
    RETURNING id, available_at, created_at
)
INSERT INTO bench_limit_delivery (message_id, queue_id, state, attempts, available_at, created_at)
SELECT m.id, :queue::uuid, 'ready', 0, m.available_at, m.created_at FROM m;
