-- pgmb: pgmb.send_unique with a key a live delivery holds: skipped, the live one's id returned.
\set k random(1, 3)
SELECT pgmb.send_unique(gen_random_uuid(), (:keys::text[])[:k], :body::jsonb, 'bench-live');
