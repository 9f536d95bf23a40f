-- pgmb: the SQL function, one message routed to order_queue by its routing key.
\set k random(1, 3)
SELECT pgmb.send(gen_random_uuid(), (:keys::text[])[:k], :body::jsonb);
