-- pgmb: read 100 messages of the pull queue "pullq_bare" (keep_history off: a delete writes no history row, as PGMQ's), delete them.
SELECT count(*) FROM pgmb.delete('pullq_bare', ARRAY(SELECT delivery_id FROM pgmb.read('pullq_bare', 30, 100)));
