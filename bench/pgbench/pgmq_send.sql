-- PGMQ: one message into queue "q" (pgmq.send returns the new id).
SELECT pgmq.send('q', :body::jsonb);
