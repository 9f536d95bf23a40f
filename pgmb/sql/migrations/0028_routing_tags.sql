-- pgmb 0028: routing to many queues looks words up at their place in the key.
--
-- 0019 took to the regex only the queues whose literal words are all words of the key
-- (a GIN index of pgmb_queue.literal_words). A word shared at another place still made a
-- queue a candidate: with 1,000 queues, a third of them `*.svcN.created`, every
-- `order.created` message rechecked 333 queues (86 us a message, 0.26 of the rate with 5
-- queues; docs/benchmarks.md). Here each literal word of a binding is tagged with its
-- place when the binding fixes it, and a key's words are tagged at every place they hold:
-- a queue is a candidate only if all its tags are tags of the key (GIN, `<@`), and the
-- regex stays the final test.
--
-- The tags (P = 4, the places looked at; docs/decisions.md has the proof):
--   binding word w at place i of m (1-based), neither `*` nor `#`:
--     'i.w'   when no `#` comes before it and i <= P (its place from the start is fixed:
--             each earlier word, `*` or literal, matches exactly one word);
--     '-j.w'  else, when no `#` comes after it and j = m - i + 1 <= P (fixed from the end);
--     'w'     else (it is somewhere in the key).
--   key of n words: every word w, and 'i.' || (word i) and '-i.' || (word n - i + 1) for
--     i = 1..P ('' past the key's end: a tag no binding that could match has).
-- A word of a key never holds '.', a place tag always does, and the text before a tag's
-- first '.' is its place: no tag can be mistaken for another or for a word.
--
-- P bounds the work per message: the key's tags are one expression of split_parts (about
-- 0.8 us a message, inlined), where tagging every place takes a subquery (about 3.6 us,
-- a sixth of a publish with 5 queues). A binding word fixed beyond place P is tagged from
-- the other end, or plain: a weaker filter for very long bindings, never a wrong one.

-- The tags of a binding key (see above). Run only when a queue is written.
CREATE FUNCTION pgmb.binding_tags(binding_key text) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(CASE
               WHEN NOT '#' = ANY (words[:i - 1]) AND i <= 4 THEN i || '.' || word
               WHEN NOT '#' = ANY (words[i + 1:]) AND cardinality(words) - i + 1 <= 4
                   THEN '-' || (cardinality(words) - i + 1) || '.' || word
               ELSE word END ORDER BY i), '{}')
    FROM string_to_array(binding_key, '.') AS words,
         unnest(words) WITH ORDINALITY AS w(word, i)
    WHERE word NOT IN ('*', '#')
$$;

-- The tags of a routing key (see above). Not STRICT, one expression: PostgreSQL inlines it
-- into the routing trigger's statement (a call of a SQL function costs ~6 us a message).
-- Places from the end through reverse(), not split_part's negative positions (PostgreSQL 14+).
CREATE FUNCTION pgmb.key_tags(routing_key text) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT string_to_array(routing_key, '.') || ARRAY[
        '1.' || split_part(routing_key, '.', 1), '-1.' || reverse(split_part(reverse(routing_key), '.', 1)),
        '2.' || split_part(routing_key, '.', 2), '-2.' || reverse(split_part(reverse(routing_key), '.', 2)),
        '3.' || split_part(routing_key, '.', 3), '-3.' || reverse(split_part(reverse(routing_key), '.', 3)),
        '4.' || split_part(routing_key, '.', 4), '-4.' || reverse(split_part(reverse(routing_key), '.', 4))]
$$;

ALTER TABLE pgmb_queue ADD COLUMN binding_tags text[] NOT NULL DEFAULT '{}';

-- As in 0019, with the binding's tags in place of its literal words.
CREATE OR REPLACE FUNCTION pgmb.prepare_queue(q pgmb_queue) RETURNS pgmb_queue
LANGUAGE plpgsql AS $$
DECLARE
    other text;
BEGIN
    PERFORM pgmb.check_name('queue', q.name);
    SELECT name INTO other FROM pgmb_queue
    WHERE pgmb.view_base(name) = pgmb.view_base(q.name) AND id <> q.id;
    IF FOUND AND other = q.name THEN
        RAISE EXCEPTION 'queue % already exists', quote_literal(other) USING ERRCODE = 'unique_violation';
    ELSIF FOUND THEN
        RAISE EXCEPTION 'queue name % clashes with queue %', quote_literal(q.name), quote_literal(other)
            USING ERRCODE = 'unique_violation',
                  DETAIL = format('Both would own the view pgmb.%I.', pgmb.view_base(q.name) || '_queue');
    END IF;
    q.pattern := pgmb.compile_binding(q.binding_key);
    q.binding_tags := pgmb.binding_tags(q.binding_key);
    IF q.max_retries IS NULL OR q.max_retries < 0 THEN
        RAISE EXCEPTION 'invalid max_retries % for queue %: it must be 0 or more', q.max_retries, q.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF q.backoff_base < 0 OR q.backoff_max < q.backoff_base THEN
        RAISE EXCEPTION 'invalid backoff for queue %: need 0 <= base (%) <= cap (%)', q.name, q.backoff_base, q.backoff_max
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF q.lease_seconds <= 0 THEN
        RAISE EXCEPTION 'invalid lease for queue %: it must be positive', q.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- NaN compares above every number here, so these also refuse it.
    IF q.lease_seconds > 2592000 OR q.backoff_base > 2592000 OR q.backoff_max > 2592000 THEN
        RAISE EXCEPTION 'invalid durations for queue %: the lease and the backoff may be at most 30 days (2592000 s)', q.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN q;
END $$;

UPDATE pgmb_queue SET binding_tags = pgmb.binding_tags(binding_key);

CREATE INDEX pgmb_queue_binding_tags ON pgmb_queue USING gin (binding_tags);

-- As in 0026, with the queues' candidates found by their tags.
CREATE OR REPLACE FUNCTION pgmb.admit_message(m pgmb_message) RETURNS pgmb_message
LANGUAGE plpgsql AS $$
DECLARE
    missing uuid;
    window_seconds float8;
    problem text := pgmb.message_options_problem(m.id, m.priority, m.group_key, m.depends_on,
                                                 m.dedup_id, m.max_retries, m.retry_delay);
BEGIN
    -- What the CHECK pgmb_message_options_valid enforced until 0026, with its name and code.
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'message % refused by pgmb_message_options_valid: %', m.id, problem
            USING ERRCODE = 'check_violation', CONSTRAINT = 'pgmb_message_options_valid';
    END IF;
    IF m.depends_on IS NOT NULL THEN
        SELECT dep INTO missing FROM unnest(m.depends_on) AS dep
        WHERE NOT EXISTS (SELECT FROM pgmb_message x WHERE x.id = dep) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'message % depends on message %, which does not exist', m.id, missing
                USING ERRCODE = 'foreign_key_violation',
                      HINT = 'Publish the messages it depends on first (earlier in the same batch is fine).';
        END IF;
    END IF;
    IF m.dedup_id IS NOT NULL THEN
        -- Concurrent publishers of one dedup id take turns; the second sees the first.
        PERFORM pg_advisory_xact_lock(hashtextextended('pgmb dedup ' || m.dedup_id, 0));
        SELECT max(q.dedup_window) INTO window_seconds FROM pgmb_queue q
        WHERE q.binding_tags <@ pgmb.key_tags(m.routing_key)
          AND ('.' || m.routing_key) ~ q.pattern;
        IF window_seconds > 0 AND EXISTS (
            SELECT FROM pgmb_message x
            WHERE x.dedup_id = m.dedup_id AND x.id <> m.id
              AND x.created_at > coalesce(m.created_at, now()) - window_seconds * interval '1 second') THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN m;
END $$;

DROP INDEX pgmb_queue_literal_words;
ALTER TABLE pgmb_queue DROP COLUMN literal_words;
DROP FUNCTION pgmb.binding_literals(text);
