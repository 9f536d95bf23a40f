-- pgmb: 100 messages in one INSERT ... SELECT (ids from the column default), routed by the trigger.
INSERT INTO pgmb_message (routing_key, body)
SELECT (:keys::text[])[1 + g % 3], :body::jsonb
FROM generate_series(1, 100) AS g;
