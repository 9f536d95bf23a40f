-- pgmb 0010: time-ordered message ids. pgmb.uuid_v7() makes a version 7 UUID (RFC 9562):
-- 48 bits of Unix time in milliseconds, then random bits, as pgmb.ids.uuid7() does in
-- Python. New ids sort after older ones, so the message key index grows at its right
-- edge instead of taking a random page per publish. Ids given by callers may be any UUID.

-- gen_random_uuid() gives 122 random bits with version 4 (0100) and the RFC variant; the
-- first 6 bytes become the time, and bits 52 and 53 (set_bit counts from each byte's low
-- bit) turn the version nibble from 0100 into 0111.
CREATE FUNCTION pgmb.uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

ALTER TABLE pgmb_message ALTER COLUMN id SET DEFAULT pgmb.uuid_v7();
