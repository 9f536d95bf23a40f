-- pgmb: read 100 messages of the pull queue "pullq" (visibility timeout 30 s), delete them.
SELECT count(*) FROM pgmb.delete('pullq', ARRAY(SELECT delivery_id FROM pgmb.read('pullq', 30, 100)));
