-- pgmb 0018: the routing-key CHECK of pgmb_message costs what its expression costs.
--
-- pgmb.valid_key and pgmb.valid_routing_key were STRICT. PostgreSQL inlines a STRICT SQL
-- function only if its body is strict too, and a body with AND is not: every message's
-- CHECK called both functions through the SQL-function executor, ~12.8 us a row against
-- ~1 us for the same expression inline, about half the server's time per message in
-- batches (docs/benchmarks.md, "pgmb against PGMQ"). Without STRICT they are inlined; the
-- results are the same, NULL included (NULL compared, measured or matched is NULL, and so
-- is their AND).

CREATE OR REPLACE FUNCTION pgmb.valid_key(key text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT key <> '' AND length(key) <= 255
             AND key !~ '[\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]' $$;

CREATE OR REPLACE FUNCTION pgmb.valid_routing_key(routing_key text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT pgmb.valid_key(routing_key) AND routing_key !~ '[*#]' $$;
