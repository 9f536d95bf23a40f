-- PGMQ: read 100 messages of queue "q" (visibility timeout 30 s), archive them (kept, as pgmb keeps a history row).
SELECT count(*) FROM pgmq.archive('q', ARRAY(SELECT msg_id FROM pgmq.read('q', 30, 100)));
