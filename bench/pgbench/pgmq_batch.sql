-- PGMQ: 100 messages into queue "q" (pgmq.send_batch returns their ids; counted in the server).
SELECT count(*) FROM pgmq.send_batch('q', ARRAY(SELECT :body::jsonb FROM generate_series(1, 100)));
