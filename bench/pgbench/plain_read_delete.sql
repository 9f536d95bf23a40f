-- Baseline: the 100 oldest visible rows of a plain table, skipping locked ones, deleted in one statement.
WITH taken AS (DELETE FROM bench_pull_baseline WHERE id IN (SELECT id FROM bench_pull_baseline WHERE vt <= now() ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED) RETURNING id)
SELECT count(*) FROM taken;
