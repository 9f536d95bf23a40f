-- pgmb: one message whose routing key (:fankey) is bound by :k queues: one message row, k deliveries.
SELECT pgmb.send(gen_random_uuid(), :fankey, :body::jsonb);
