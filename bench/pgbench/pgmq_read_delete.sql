-- PGMQ: read 100 messages of queue "q" (visibility timeout 30 s), delete them.
SELECT count(*) FROM pgmq.delete('q', ARRAY(SELECT msg_id FROM pgmq.read('q', 30, 100)));
