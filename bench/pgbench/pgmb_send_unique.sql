-- pgmb: pgmb.send_unique with a key of its own (nothing live holds it): stored and routed.
\set k random(1, 3)
SELECT pgmb.send_unique(gen_random_uuid(), (:keys::text[])[:k], :body::jsonb, gen_random_uuid()::text);
