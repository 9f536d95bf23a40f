-- Fair shares per key (docs/fairness.md, docs/decisions/0082-fair-shares-per-key.md). A
-- queue may name a header as its fairness key (pgmb.fairness): its claims then take the
-- keys in turn, least recently served first, each key `weight` deliveries a turn, instead
-- of oldest first; a key may be capped (requests in flight) and rate-limited. A queue
-- without one is claimed as before and pays nothing: the routing trigger copies no header,
-- no row reaches the indexes or the trigger below, and the claim's pick is its own.

-- The queue's fairness header (NULL: off), and each delivery's value of it (copied by the
-- routing trigger for a queue that names one; '' for a message without the header).
-- Defaults NULL: adding them writes no row, and 0.1.1's statements do not name them.
ALTER TABLE pgmb_queue ADD COLUMN IF NOT EXISTS fairness_header text;
ALTER TABLE pgmb_queue DROP CONSTRAINT IF EXISTS pgmb_queue_fairness_header_valid;
ALTER TABLE pgmb_queue ADD CONSTRAINT pgmb_queue_fairness_header_valid
    CHECK (fairness_header IS NULL OR pgmb.valid_key(fairness_header));
ALTER TABLE pgmb_delivery ADD COLUMN IF NOT EXISTS fair_key text;

-- A delivery's fairness key on a queue with fairness header `header` (NULL: none): the
-- header's value, '' for a message without it. Every writer of deliveries sets it so (the
-- routing trigger, pgmb.requeue, pgmb.replay): a fair queue picks only rows with a key.
-- Inlined where it is called: no call per message.
CREATE OR REPLACE FUNCTION pgmb.delivery_fair_key(header text, headers jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN header IS NOT NULL THEN coalesce(headers ->> header, '') END $$;

-- A key's ready deliveries in claim order, and its requests in flight (the cap): one
-- index for both, which only rows of fair queues enter (every write of a delivery tests
-- each partial index's predicate: one is cheaper for the others than two).
CREATE INDEX IF NOT EXISTS pgmb_delivery_fair ON pgmb_delivery (queue_id, fair_key, state, priority, available_at, id)
    WHERE fair_key IS NOT NULL;

-- One row per key of a fair queue: its settings (weight, max_in_flight, rps; written
-- through pgmb.fair_key, the CHECKs hold for every writer) and its turn (served_at, the
-- credit left of a turn a claim cut short, the rate bucket). Made by the first delivery of
-- the key (pgmb.note_fair_key). No foreign key, as pgmb.queue_grant: Django's flush
-- truncates pgmb_queue alone; the queue's deletion takes its rows (pgmb.forget_fair_keys).
CREATE TABLE IF NOT EXISTS pgmb.fair_key (
    queue_id uuid NOT NULL,
    key text NOT NULL,
    weight integer NOT NULL DEFAULT 1 CONSTRAINT fair_key_weight_valid CHECK (weight BETWEEN 1 AND 1000),
    max_in_flight integer CONSTRAINT fair_key_max_in_flight_valid CHECK (max_in_flight >= 1),
    rps double precision CONSTRAINT fair_key_rps_valid CHECK (rps > 0 AND rps < 'Infinity'::float8),
    served_at timestamptz,
    credit integer,
    tokens double precision,
    tokens_at timestamptz,
    CONSTRAINT fair_key_pkey PRIMARY KEY (queue_id, key)
);
-- The claim's order of turns.
CREATE INDEX IF NOT EXISTS fair_key_turn ON pgmb.fair_key (queue_id, served_at NULLS FIRST, key);

-- After a delivery with a fairness key is stored: its key's row, if it has none yet.
CREATE OR REPLACE FUNCTION pgmb.note_fair_key() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM FROM pgmb.fair_key k WHERE k.queue_id = NEW.queue_id AND k.key = NEW.fair_key;
    IF NOT FOUND THEN
        INSERT INTO pgmb.fair_key (queue_id, key) VALUES (NEW.queue_id, NEW.fair_key)
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS pgmb_delivery_fair_key ON pgmb_delivery;
CREATE TRIGGER pgmb_delivery_fair_key AFTER INSERT OR UPDATE OF fair_key ON pgmb_delivery
    FOR EACH ROW WHEN (NEW.fair_key IS NOT NULL) EXECUTE FUNCTION pgmb.note_fair_key();

-- A deleted queue's keys go with it.
CREATE OR REPLACE FUNCTION pgmb.forget_fair_keys() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM pgmb.fair_key k WHERE k.queue_id = OLD.id;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS pgmb_queue_fair_keys ON pgmb_queue;
CREATE TRIGGER pgmb_queue_fair_keys AFTER DELETE ON pgmb_queue
    FOR EACH ROW WHEN (OLD.fairness_header IS NOT NULL) EXECUTE FUNCTION pgmb.forget_fair_keys();

-- The queue's id by name, or 22023 naming the queue.
CREATE OR REPLACE FUNCTION pgmb.fair_queue_id(queue_name text) RETURNS uuid
LANGUAGE plpgsql STABLE AS $$
DECLARE
    found_id uuid;
BEGIN
    SELECT q.id INTO found_id FROM pgmb_queue q WHERE q.name = queue_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown queue %', quote_nullable(queue_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN found_id;
END $$;

-- Names the header whose value is a queue's fairness key (NULL: off, claims oldest first
-- again). The queue's live deliveries take their key from it at once (with none, the
-- ones stored before would never be picked), and every key's turn starts afresh. Returns
-- the queue's id.
CREATE OR REPLACE FUNCTION pgmb.fairness(queue_name text, header text) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    qid uuid := pgmb.fair_queue_id(queue_name);
BEGIN
    IF header IS NOT NULL AND NOT pgmb.valid_key(header) THEN
        RAISE EXCEPTION 'invalid fairness header %: 1 to 255 characters without blanks or control characters',
                        quote_literal(header)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Taken first, so that no publish routes to the queue with the old header meanwhile.
    PERFORM FROM pgmb_queue q WHERE q.id = qid FOR UPDATE;
    UPDATE pgmb_queue q SET fairness_header = header
    WHERE q.id = qid AND q.fairness_header IS DISTINCT FROM header;
    IF FOUND THEN
        -- Turns start afresh; the keys' own settings stay, those with none go.
        DELETE FROM pgmb.fair_key k
        WHERE k.queue_id = qid AND k.weight = 1 AND k.max_in_flight IS NULL AND k.rps IS NULL;
        UPDATE pgmb.fair_key k SET served_at = NULL, credit = NULL, tokens = NULL, tokens_at = NULL
        WHERE k.queue_id = qid;
        -- Each live delivery's key (its row is made by pgmb.note_fair_key).
        UPDATE pgmb_delivery d
        SET fair_key = pgmb.delivery_fair_key(header, m.headers)
        FROM pgmb_message m
        WHERE d.queue_id = qid AND m.id = d.message_id;
        PERFORM pgmb.wake_dispatchers();
    END IF;
    RETURN qid;
END $$;

-- Sets a key's settings on a fair queue: its weight (deliveries per turn, 1 to 1000), its
-- cap on requests in flight (NULL: none; 1 delivers the key's messages one at a time, as
-- an ordered group does, though not strictly in order across retries) and its rate limit
-- in requests a second (NULL: none). The key need not have been seen yet, nor the
-- queue name its header yet: the settings apply while it does.
CREATE OR REPLACE FUNCTION pgmb.fair_key(queue_name text, key text, weight integer DEFAULT 1,
                                         max_in_flight integer DEFAULT NULL, rps float8 DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    qid uuid := pgmb.fair_queue_id(queue_name);
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'invalid fairness key: NULL (a message without the header has the key '''')'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF weight IS NULL OR weight < 1 OR weight > 1000 THEN
        RAISE EXCEPTION 'invalid weight %: a whole number from 1 to 1000', coalesce(weight::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_in_flight < 1 THEN
        RAISE EXCEPTION 'invalid max_in_flight %: at least 1 (NULL: no cap)', max_in_flight
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (rps > 0 AND rps < 'Infinity'::float8) THEN
        RAISE EXCEPTION 'invalid rps %: a positive, finite number (NULL: no limit)', rps
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pgmb.fair_key AS k (queue_id, key, weight, max_in_flight, rps)
    VALUES (qid, fair_key.key, fair_key.weight, fair_key.max_in_flight, fair_key.rps)
    ON CONFLICT ON CONSTRAINT fair_key_pkey DO UPDATE
    SET weight = excluded.weight, max_in_flight = excluded.max_in_flight, rps = excluded.rps,
        tokens = CASE WHEN excluded.rps IS NULL THEN NULL ELSE least(k.tokens, greatest(1, excluded.rps)) END;
END $$;

-- The pick of pgmb.claim for a queue with a fairness header: up to `wanted` ids of due
-- deliveries, locked. The keys with due deliveries are taken least recently served first
-- (locked, SKIP LOCKED: concurrent claims serve different keys), each allowed what its
-- cap (in flight now) and its rate bucket leave; then round after round each key gets up
-- to its weight (the first round: what was left of a turn the last claim cut short) until
-- `wanted` are picked or no key has more. A served key's turn moves behind the others;
-- the ids are returned round by round. Planned as pgmb.claim.
CREATE OR REPLACE FUNCTION pgmb.fair_pick(q uuid, wanted integer, t timestamptz) RETURNS bigint[]
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
    AS $$
DECLARE
    keys text[];
    weights integer[];
    credits integer[];
    allowed integer[];
    buckets float8[];
    given integer[];
    last_turn integer[];
    n integer;
    i integer;
    give integer;
    quota integer;
    left_over integer := wanted;
    turn integer := 0;
    round integer := 0;
    progress boolean;
    cut integer := 0;
    cut_credit integer;
    part bigint[];
    ids bigint[] := '{}';
    places integer[] := '{}';
    ranks integer[] := '{}';
BEGIN
    keys := ARRAY(
        SELECT k.key FROM pgmb.fair_key k
        WHERE k.queue_id = q
          AND EXISTS (SELECT FROM pgmb_delivery d
                      WHERE d.queue_id = q AND d.fair_key = k.key AND d.state = 'ready' AND d.available_at <= t
                        AND (d.expires_at IS NULL OR d.expires_at > t))
        ORDER BY k.served_at NULLS FIRST, k.key
        LIMIT wanted
        FOR UPDATE OF k SKIP LOCKED);
    n := cardinality(keys);
    IF n = 0 THEN
        RETURN '{}';
    END IF;
    -- What each key may have: a statement of its own, after the keys are locked, so that
    -- it sees the leases of the claim that held a key before (committed by then) and a cap
    -- holds across claims; a lease that ran out is not counted (a killed dispatcher's slots
    -- come back with it, as a worker's cap's do). wanted + 1 stands for "more than this
    -- claim takes".
    SELECT array_agg(k.weight ORDER BY u.n), array_agg(k.credit ORDER BY u.n),
           array_agg(least(
               CASE WHEN k.max_in_flight IS NULL THEN wanted + 1
                    ELSE k.max_in_flight - (SELECT count(*) FROM pgmb_delivery l
                                            WHERE l.queue_id = q AND l.fair_key = k.key AND l.state = 'leased'
                                              AND l.available_at > t) END,
               CASE WHEN k.rps IS NULL THEN wanted + 1 ELSE floor(b.bucket) END,
               (SELECT count(*) FROM (SELECT FROM pgmb_delivery d
                                      WHERE d.queue_id = q AND d.fair_key = k.key AND d.state = 'ready'
                                        AND d.available_at <= t
                                        AND (d.expires_at IS NULL OR d.expires_at > t)
                                      LIMIT wanted + 1) AS due))::integer ORDER BY u.n),
           array_agg(b.bucket ORDER BY u.n)
    INTO weights, credits, allowed, buckets
    FROM unnest(keys) WITH ORDINALITY AS u(key, n)
    JOIN pgmb.fair_key k ON k.queue_id = q AND k.key = u.key
    CROSS JOIN LATERAL (SELECT CASE WHEN k.rps IS NOT NULL THEN
                            least(greatest(1, k.rps),
                                  coalesce(k.tokens, greatest(1, k.rps))
                                  + k.rps * extract(epoch FROM t - coalesce(k.tokens_at, t)))
                        END AS bucket) AS b;
    given := array_fill(0, ARRAY[n]);
    last_turn := array_fill(0, ARRAY[n]);
    LOOP
        progress := false;
        FOR i IN 1..n LOOP
            EXIT WHEN left_over <= 0;
            quota := CASE WHEN round = 0 THEN coalesce(credits[i], weights[i]) ELSE weights[i] END;
            give := least(quota, allowed[i] - given[i]);
            CONTINUE WHEN give <= 0;
            -- The claim ends within this key's turn: the rest of it comes first next time.
            IF give > left_over THEN
                cut := i;
                cut_credit := quota - left_over;
                give := left_over;
            END IF;
            given[i] := given[i] + give;
            left_over := left_over - give;
            turn := turn + 1;
            last_turn[i] := turn;
            progress := true;
        END LOOP;
        EXIT WHEN left_over <= 0 OR NOT progress;
        round := round + 1;
    END LOOP;
    FOR i IN 1..n LOOP
        CONTINUE WHEN given[i] = 0;
        part := ARRAY(
            SELECT d.id FROM pgmb_delivery d
            WHERE d.queue_id = q AND d.fair_key = keys[i] AND d.state = 'ready' AND d.available_at <= t
              AND (d.expires_at IS NULL OR d.expires_at > t)  -- expired: pgmb.expire's
            ORDER BY d.priority, d.available_at, d.id
            LIMIT given[i]
            FOR NO KEY UPDATE SKIP LOCKED);
        given[i] := cardinality(part);
        ids := ids || part;
        places := places || array_fill(i, ARRAY[given[i]]);
        ranks := ranks || ARRAY(SELECT generate_series(1, given[i]));
    END LOOP;
    UPDATE pgmb.fair_key k
    SET served_at = CASE WHEN u.n = cut THEN k.served_at ELSE t + u.turn * interval '1 microsecond' END,
        credit = CASE WHEN u.n = cut THEN cut_credit END,
        tokens = u.bucket - u.taken,
        tokens_at = CASE WHEN u.bucket IS NOT NULL THEN t END
    FROM unnest(keys, given, last_turn, buckets) WITH ORDINALITY AS u(key, taken, turn, bucket, n)
    WHERE k.queue_id = q AND k.key = u.key AND u.taken > 0;
    -- Round by round: the r-th delivery of a key of weight w goes out in round (r - 1) / w.
    RETURN ARRAY(
        SELECT p.id FROM unnest(ids, places, ranks) AS p(id, place, rank)
        ORDER BY (p.rank - 1) / weights[p.place], p.place, p.rank);
END $$;

-- When a fair queue next has something a claim may take: the earliest due delivery of a
-- key under its cap, its rate bucket's next token counted in. NULL: nothing (every key
-- with due deliveries is at its cap: the lease's end or outcome frees it).
CREATE OR REPLACE FUNCTION pgmb.fair_next_due(q uuid) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off
AS $$
BEGIN
    RETURN (
        SELECT min(greatest(h.due, CASE WHEN k.rps IS NOT NULL AND k.tokens IS NOT NULL
                                        THEN k.tokens_at + (1 - least(k.tokens, 1)) / k.rps * interval '1 second' END))
        FROM pgmb.fair_key k
        CROSS JOIN LATERAL (SELECT d.available_at AS due FROM pgmb_delivery d
                            WHERE d.queue_id = q AND d.fair_key = k.key AND d.state = 'ready'
                            ORDER BY d.priority, d.available_at LIMIT 1) AS h
        WHERE k.queue_id = q
          AND (k.max_in_flight IS NULL
               OR k.max_in_flight > (SELECT count(*) FROM pgmb_delivery l
                                     WHERE l.queue_id = q AND l.fair_key = k.key AND l.state = 'leased'
                                       AND l.available_at > clock_timestamp())));
END $$;

-- Closed by default (access.sql): the owner and pgmb_admin call these.
REVOKE EXECUTE ON FUNCTION pgmb.note_fair_key(), pgmb.forget_fair_keys(), pgmb.fair_queue_id(text),
    pgmb.fairness(text, text), pgmb.fair_key(text, text, integer, integer, double precision),
    pgmb.fair_pick(uuid, integer, timestamptz), pgmb.fair_next_due(uuid),
    pgmb.delivery_fair_key(text, jsonb)
FROM PUBLIC;
