-- Baseline: one row into the plain twin of pgmb_message (no trigger, no delivery).
\set k random(1, 3)
INSERT INTO bench_baseline (id, routing_key, body)
VALUES (gen_random_uuid(), (:keys::text[])[:k], :body::jsonb);
