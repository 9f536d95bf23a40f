-- Reverse of 0018_inline_key_checks: the key rules STRICT again, as 0003 left them.
CREATE OR REPLACE FUNCTION pgmb.valid_key(key text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT key <> '' AND length(key) <= 255
             AND key !~ '[\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]' $$;

CREATE OR REPLACE FUNCTION pgmb.valid_routing_key(routing_key text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT pgmb.valid_key(routing_key) AND routing_key !~ '[*#]' $$;
