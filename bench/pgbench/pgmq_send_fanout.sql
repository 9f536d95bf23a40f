-- PGMQ: one message to each of :k queues ("f1" .. "fk"), one statement, one transaction.
SELECT pgmq.send('f' || g, :body::jsonb) FROM generate_series(1, :k) AS g;
