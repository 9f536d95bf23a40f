-- Baseline: 100 rows into the plain twin of pgmb_message in one statement.
INSERT INTO bench_baseline (id, routing_key, body)
SELECT gen_random_uuid(), (:keys::text[])[1 + g % 3], :body::jsonb
FROM generate_series(1, 100) AS g;
