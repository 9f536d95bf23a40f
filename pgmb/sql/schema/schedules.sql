-- Schedules (docs/schedules.md, docs/decisions/0089-schedules-fired-by-the-loops.md): a row
-- of pgmb_schedule publishes its message at each due time of a cron expression (5 fields,
-- in a time zone) or of a fixed interval. Whichever loop runs fires it, the external
-- dispatchers or the in-database loop, through pgmb.fire_due_schedules: due rows locked FOR
-- UPDATE SKIP LOCKED, each due time's message published through pgmb.send with an id
-- derived from (schedule, due time), and the row advanced in the same transaction. So a due
-- time is fired once whatever runs, and a crash before the commit fires it again, never twice.

-- ---------------------------------------------------------------------------------------
-- The cron rule. Python reads cron expressions with cronsim (pgmb/schedules.py); the
-- in-database loop must compute a next due time without Python, so the same rule is here:
-- cronsim's algorithm for 5-field expressions, step for step, and tests/rules/test_cron.py
-- runs one table of cases (DST edges included) and a sweep of generated expressions
-- through both. What cronsim accepts beyond this (L, W, #, 6 fields) both refuse.
-- ---------------------------------------------------------------------------------------

-- The message of a bad expression, the same words as pgmb/schedules.py's.
CREATE OR REPLACE FUNCTION pgmb.cron_refuse(expr text, detail text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION 'bad cron expression "%": %', expr, detail
        USING ERRCODE = 'invalid_parameter_value',
              HINT = 'Five fields: minute hour day-of-month month day-of-week (numbers, *, ranges, steps, lists, JAN-DEC, SUN-SAT).';
END $$;

-- One number (or a month or day name) of field `field` (1 minute, 2 hour, 3 day of the month,
-- 4 month, 5 day of the week), as cronsim reads it: digits only, within the field's range.
CREATE OR REPLACE FUNCTION pgmb.cron_number(expr text, s text, field integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v integer;
BEGIN
    IF field = 4 AND s = ANY ('{JAN,FEB,MAR,APR,MAY,JUN,JUL,AUG,SEP,OCT,NOV,DEC}') THEN
        RETURN array_position('{JAN,FEB,MAR,APR,MAY,JUN,JUL,AUG,SEP,OCT,NOV,DEC}'::text[], s);
    END IF;
    IF field = 5 AND s = ANY ('{SUN,MON,TUE,WED,THU,FRI,SAT}') THEN
        RETURN array_position('{SUN,MON,TUE,WED,THU,FRI,SAT}'::text[], s) - 1;
    END IF;
    -- Past 9 digits out of every range anyway (and of integer's).
    IF s !~ '^[0-9]{1,9}$' THEN
        PERFORM pgmb.cron_refuse(expr, 'bad ' || (ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'])[field]);
    END IF;
    v := s::integer;
    IF v < (ARRAY[0, 0, 1, 1, 0])[field] OR v > (ARRAY[59, 23, 31, 12, 7])[field] THEN
        PERFORM pgmb.cron_refuse(expr, 'bad ' || (ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'])[field]);
    END IF;
    RETURN v;
END $$;

-- The values field `field`'s text `s` allows, sorted: cronsim's Field.parse (a list is read
-- first, then a step, then a range; a step over one value runs to the field's end).
CREATE OR REPLACE FUNCTION pgmb.cron_field(expr text, s text, field integer) RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    lo integer := (ARRAY[0, 0, 1, 1, 0])[field];
    hi integer := (ARRAY[59, 23, 31, 12, 7])[field];
    items integer[] := '{}';
    term text;
    step_text text;
    step integer;
    a integer;
    b integer;
BEGIN
    IF s = '*' THEN
        RETURN ARRAY(SELECT generate_series(lo, hi));
    END IF;
    IF strpos(s, ',') > 0 THEN
        FOREACH term IN ARRAY string_to_array(s, ',') LOOP
            items := items || pgmb.cron_field(expr, term, field);
        END LOOP;
        RETURN ARRAY(SELECT DISTINCT x FROM unnest(items) AS x ORDER BY x);
    END IF;
    IF strpos(s, '/') > 0 THEN
        term := split_part(s, '/', 1);
        step_text := substring(s FROM strpos(s, '/') + 1);
        IF step_text !~ '^[0-9]+$' OR step_text ~ '^0+$' THEN
            PERFORM pgmb.cron_refuse(expr, 'bad ' || (ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'])[field]);
        END IF;
        -- A step past every range picks one value, as any step over 60 does.
        step := CASE WHEN length(step_text) > 9 THEN 1000000000 ELSE step_text::integer END;
        items := pgmb.cron_field(expr, term, field);
        IF cardinality(items) = 1 THEN
            RETURN ARRAY(SELECT generate_series(items[1], hi, step));
        END IF;
        RETURN ARRAY(SELECT x FROM unnest(items) WITH ORDINALITY AS u(x, n) WHERE (n - 1) % step = 0 ORDER BY n);
    END IF;
    IF strpos(s, '-') > 0 THEN
        a := pgmb.cron_number(expr, split_part(s, '-', 1), field);
        b := pgmb.cron_number(expr, substring(s FROM strpos(s, '-') + 1), field);
        IF b < a THEN
            PERFORM pgmb.cron_refuse(expr, 'bad ' || (ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'])[field]);
        END IF;
        RETURN ARRAY(SELECT generate_series(a, b));
    END IF;
    RETURN ARRAY[pgmb.cron_number(expr, s, field)];
END $$;

-- A cron expression read: each field's values, whether the day of the month AND the day of
-- the week must both match (either field starting with '*', as Debian cron and cronsim
-- read it; otherwise either one matches), and whether the next due time is found in wall
-- time (`wall`: minute and hour both fixed, cronsim's Debian-style handling of DST) or in
-- real time. Refuses what pgmb/schedules.py refuses, with the same words, in the same order.
CREATE OR REPLACE FUNCTION pgmb.cron_fields(expr text, OUT minutes integer[], OUT hours integer[],
                                            OUT days integer[], OUT months integer[], OUT weekdays integer[],
                                            OUT day_and boolean, OUT wall boolean)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    trimmed text := regexp_replace(upper(coalesce(expr, '')), '^\s+|\s+$', '', 'g');
    parts text[] := CASE WHEN trimmed = '' THEN '{}'::text[] ELSE regexp_split_to_array(trimmed, '\s+') END;
BEGIN
    IF cardinality(parts) <> 5 THEN
        PERFORM pgmb.cron_refuse(expr, format('expected 5 fields (minute hour day-of-month month day-of-week), got %s',
                                              cardinality(parts)));
    END IF;
    IF strpos(parts[3], 'L') > 0 OR strpos(parts[3], 'W') > 0 OR strpos(parts[5], 'L') > 0
       OR strpos(parts[5], '#') > 0 THEN
        PERFORM pgmb.cron_refuse(expr, 'L, W and # are not supported');
    END IF;
    minutes := pgmb.cron_field(expr, parts[1], 1);
    hours := pgmb.cron_field(expr, parts[2], 2);
    days := pgmb.cron_field(expr, parts[3], 3);
    months := pgmb.cron_field(expr, parts[4], 4);
    weekdays := pgmb.cron_field(expr, parts[5], 5);
    day_and := left(parts[3], 1) = '*' OR left(parts[5], 1) = '*';
    -- Days that no month chosen has, when they must match: never due.
    IF day_and AND days[1] > 29
       AND days[1] > (SELECT max((ARRAY[31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[m]) FROM unnest(months) AS m) THEN
        PERFORM pgmb.cron_refuse(expr, 'bad day-of-month');
    END IF;
    wall := left(parts[1], 1) <> '*' AND left(parts[2], 1) <> '*';
END $$;

-- Refuses a time zone that is not an IANA name PostgreSQL knows (the same test as Python's
-- zoneinfo, where both have the zone): "Europe/Berlin", "UTC"; no offsets or POSIX rules.
CREATE OR REPLACE FUNCTION pgmb.check_time_zone(tz text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF tz IS NULL OR tz !~ '^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$'
       OR NOT EXISTS (SELECT FROM pg_timezone_names WHERE name = tz) THEN
        RAISE EXCEPTION 'unknown time zone "%"', tz USING ERRCODE = 'invalid_parameter_value',
            HINT = 'An IANA time zone name, such as UTC or Europe/Berlin.';
    END IF;
    RETURN tz;
END $$;

-- The first instant whose wall time in `tz` is `w` (of two in an hour the clocks go back
-- over: the first, Python's fold=0), or NULL for a wall time the zone skips. The zone's
-- offsets a day either side are the candidates: clocks change at most once in a day.
CREATE OR REPLACE FUNCTION pgmb.wall_instant(w timestamp, tz text) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(c) FROM (
        SELECT (w AT TIME ZONE 'UTC') - ((u AT TIME ZONE tz) - (u AT TIME ZONE 'UTC')) AS c
        FROM (VALUES ((w AT TIME ZONE 'UTC') - interval '1 day'), ((w AT TIME ZONE 'UTC') + interval '1 day')) AS v(u)
    ) AS candidates
    WHERE c AT TIME ZONE tz = w
$$;

-- The first due time of cron expression `expr` in time zone `tz` after `after` (to the
-- second): cronsim's CronSim(expr, after in tz) and next(), step for step. With minute and
-- hour fixed the search runs in wall time, and a due time the clocks skip moves to the first
-- wall minute that exists (02:30 on the spring-forward day is 03:00), one they repeat is
-- taken once, the first time; otherwise it runs in real time (ticks in UTC seconds), so
-- "0 * * * *" is due every real hour. Zones whose clocks change at midnight or by less than
-- whole minutes may differ from cronsim; the tested ones (UTC, Europe/Berlin) do not.
CREATE OR REPLACE FUNCTION pgmb.cron_next(expr text, tz text, after timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    f record;
    -- Wall-time search: w; real-time search: t. cur is the wall time looked at.
    w timestamp;
    t timestamptz;
    cur timestamp;
    needle date;
    start_year integer;
    delta integer;
    result timestamptz;
BEGIN
    f := pgmb.cron_fields(expr);
    PERFORM pgmb.check_time_zone(tz);
    IF after IS NULL THEN
        RAISE EXCEPTION 'a time to start from is required' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- Microseconds dropped, then one second on (cronsim's first tick).
    IF f.wall THEN
        w := date_trunc('second', after AT TIME ZONE tz) + interval '1 second';
        cur := w;
    ELSE
        t := date_trunc('second', after AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '1 second';
        cur := t AT TIME ZONE tz;
    END IF;
    start_year := extract(year FROM cur);
    LOOP
        -- The month: the first day of the next allowed one, at midnight.
        IF NOT extract(month FROM cur)::integer = ANY (f.months) THEN
            needle := (date_trunc('month', cur) + interval '1 month')::date;
            WHILE NOT extract(month FROM needle)::integer = ANY (f.months) LOOP
                needle := (needle + interval '1 month')::date;
            END LOOP;
            IF f.wall THEN w := needle; ELSE t := coalesce(pgmb.wall_instant(needle, tz), needle AT TIME ZONE tz); END IF;
            cur := CASE WHEN f.wall THEN w ELSE t AT TIME ZONE tz END;
        END IF;
        IF extract(year FROM cur) > start_year + 50 THEN
            PERFORM pgmb.cron_refuse(expr, 'no due time within 50 years');
        END IF;
        -- The day: on to one that matches, or to the first of the next month (checked again).
        needle := cur::date;
        IF NOT pgmb.cron_day_matches(needle, f.days, f.weekdays, f.day_and) THEN
            LOOP
                needle := needle + 1;
                EXIT WHEN pgmb.cron_day_matches(needle, f.days, f.weekdays, f.day_and) OR extract(day FROM needle) = 1;
            END LOOP;
            IF f.wall THEN w := needle; ELSE t := coalesce(pgmb.wall_instant(needle, tz), needle AT TIME ZONE tz); END IF;
            cur := CASE WHEN f.wall THEN w ELSE t AT TIME ZONE tz END;
            CONTINUE;
        END IF;
        -- The hour: from its start, an hour at a time, to a match or midnight.
        IF NOT extract(hour FROM cur)::integer = ANY (f.hours) THEN
            delta := extract(minute FROM cur)::integer * 60 + floor(extract(second FROM cur))::integer;
            IF f.wall THEN w := w - delta * interval '1 second'; ELSE t := t - delta * interval '1 second'; END IF;
            LOOP
                IF f.wall THEN w := w + interval '1 hour'; cur := w;
                ELSE t := t + interval '1 hour'; cur := t AT TIME ZONE tz; END IF;
                EXIT WHEN extract(hour FROM cur)::integer = ANY (f.hours) OR extract(hour FROM cur) = 0;
            END LOOP;
            CONTINUE;
        END IF;
        -- The minute: from its start; one allowed minute is jumped to, several stepped to.
        IF NOT extract(minute FROM cur)::integer = ANY (f.minutes) THEN
            delta := floor(extract(second FROM cur))::integer;
            IF cardinality(f.minutes) = 1 THEN
                delta := delta - ((f.minutes[1] - extract(minute FROM cur)::integer + 60) % 60) * 60;
            END IF;
            IF f.wall THEN w := w - delta * interval '1 second'; cur := w;
            ELSE t := t - delta * interval '1 second'; cur := t AT TIME ZONE tz; END IF;
            WHILE NOT extract(minute FROM cur)::integer = ANY (f.minutes) LOOP
                IF f.wall THEN w := w + interval '1 minute'; cur := w;
                ELSE t := t + interval '1 minute'; cur := t AT TIME ZONE tz; END IF;
                EXIT WHEN extract(minute FROM cur) = 0;
            END LOOP;
            CONTINUE;
        END IF;
        -- The second: always 0 in 5 fields.
        IF floor(extract(second FROM cur)) <> 0 THEN
            delta := (60 - floor(extract(second FROM cur))::integer) % 60;
            IF f.wall THEN w := w + delta * interval '1 second'; cur := w;
            ELSE t := t + delta * interval '1 second'; cur := t AT TIME ZONE tz; END IF;
            CONTINUE;
        END IF;
        EXIT;
    END LOOP;
    IF NOT f.wall THEN
        RETURN t;
    END IF;
    -- A wall time the clocks skip: on a minute at a time to one that exists.
    LOOP
        result := pgmb.wall_instant(w, tz);
        EXIT WHEN result IS NOT NULL;
        w := w + interval '1 minute';
    END LOOP;
    RETURN result;
END $$;

-- Whether day `d` matches: its day of the month and its day of the week (0 or 7 Sunday)
-- both, or either one (day_and false).
CREATE OR REPLACE FUNCTION pgmb.cron_day_matches(d date, days integer[], weekdays integer[], day_and boolean)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN day_and THEN dom AND dow ELSE dom OR dow END
    FROM (SELECT extract(day FROM d)::integer = ANY (days) AS dom,
                 (extract(isodow FROM d)::integer = ANY (weekdays)
                  OR extract(isodow FROM d)::integer % 7 = ANY (weekdays)) AS dow) AS m
$$;

-- ---------------------------------------------------------------------------------------
-- Due times and message ids
-- ---------------------------------------------------------------------------------------

-- The first due time of schedule `s` after `t`: for an interval, in the series of `due`
-- (a due time of s) and due ± n intervals; for cron, pgmb.cron_next.
CREATE OR REPLACE FUNCTION pgmb.schedule_after(s pgmb_schedule, due timestamptz, t timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    step numeric;
BEGIN
    IF s.cron IS NOT NULL THEN
        RETURN pgmb.cron_next(s.cron, s.timezone, t);
    END IF;
    step := extract(epoch FROM s.every);
    RETURN due + (floor(extract(epoch FROM t - due) / step) + 1) * step * interval '1 second';
END $$;

-- The id of the message schedule `schedule_id` publishes for due time `due`: a UUID version
-- 8 whose first 48 bits are the due time's Unix milliseconds (so it sorts, and lands in a
-- day's history partition, as a UUID v7 of that time) and whose other bits come from an
-- MD5 of (schedule, due time). The same due time always gives the same id: a fire that
-- ran again could not store its message twice. pgmb/schedules.py computes the same.
CREATE OR REPLACE FUNCTION pgmb.schedule_message_id(schedule_id bigint, due timestamptz) RETURNS uuid
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    ms bigint := floor(extract(epoch FROM due) * 1000);
    b bytea := substring(int8send(ms) FROM 3)
               || substring(decode(md5(format('pgmb schedule %s %s', schedule_id, ms)), 'hex') FROM 7 FOR 10);
BEGIN
    b := set_byte(b, 6, (get_byte(b, 6) & 15) | 128);   -- version 8
    b := set_byte(b, 8, (get_byte(b, 8) & 63) | 128);   -- RFC 9562 variant
    RETURN encode(b, 'hex')::uuid;
END $$;

-- ---------------------------------------------------------------------------------------
-- The SQL API: schedule, pause, resume, unschedule
-- ---------------------------------------------------------------------------------------

-- Creates schedule `name`, or changes it: its message (routing key, body, headers) and when
-- (a cron expression in a time zone, or an interval of at least 1 second), what to do with
-- runs missed while nothing fired (missed: 'skip', 'once' or 'all') and, optionally, its
-- first due time (otherwise the cron's next, or now + the interval). Changing a schedule
-- keeps its next due time unless its cron, interval, time zone or first_run change. With
-- `task` (pgmb.tasks.schedule_task: {"backend", "task_path", "queue_name", "priority",
-- "args", "kwargs"}), each run enqueues that Django task (pgmb.enqueue_task: its message and
-- its READY result row) instead of publishing a plain message.
-- Returns the schedule's id. Checks everything first: bad input stores nothing.
CREATE OR REPLACE FUNCTION pgmb.schedule(name text, routing_key text, body jsonb, headers jsonb DEFAULT NULL,
                                         cron text DEFAULT NULL, every interval DEFAULT NULL,
                                         timezone text DEFAULT 'UTC', missed text DEFAULT 'once',
                                         first_run timestamptz DEFAULT NULL, task jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    problem text;
    first timestamptz;
    schedule_id bigint;
BEGIN
    IF name IS NULL OR btrim(name) = '' OR length(name) > 200 THEN
        RAISE EXCEPTION 'a schedule needs a name (1 to 200 characters)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (cron IS NULL) = (every IS NULL) THEN
        RAISE EXCEPTION 'schedule "%": give either cron or every, not both or neither', name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF every IS NOT NULL THEN
        IF extract(epoch FROM every) < 1 THEN
            RAISE EXCEPTION 'schedule "%": an interval of at least 1 second, not %', name, every
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- Fixed length: a month is 30 days, as the interval's epoch counts it.
        every := make_interval(secs => extract(epoch FROM every));
    END IF;
    PERFORM pgmb.check_time_zone(timezone);
    IF cron IS NOT NULL THEN
        PERFORM pgmb.cron_fields(cron);
    END IF;
    IF task IS NOT NULL AND (jsonb_typeof(task) <> 'object' OR NOT task ?& ARRAY['backend', 'task_path', 'queue_name']) THEN
        RAISE EXCEPTION 'schedule "%": a task is an object with backend, task_path and queue_name', name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF missed IS NULL OR missed NOT IN ('skip', 'once', 'all') THEN
        RAISE EXCEPTION 'schedule "%": missed is skip, once or all, not %', name, coalesce(missed, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pgmb.check_routing_key(routing_key);
    IF body IS NULL THEN
        RAISE EXCEPTION 'a message body is required (JSON null is ''null''::jsonb)' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- A message's headers are an object (pgmb_message's CHECK): refused here, not at each fire.
    IF jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'schedule "%": the headers are a JSON object, not %', name, jsonb_typeof(headers)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    problem := pgmb.message_problem(body, coalesce(headers, '{}'));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'schedule "%": %', name, problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    first := coalesce(first_run, CASE WHEN cron IS NOT NULL THEN pgmb.cron_next(cron, timezone, now())
                                      ELSE now() + every END);
    INSERT INTO pgmb_schedule AS s (name, cron, every, timezone, missed, routing_key, body, headers,
                                    task, paused, next_run_at, last_runs, runs, created_at)
    VALUES (schedule.name, schedule.cron, schedule.every, schedule.timezone, schedule.missed,
            schedule.routing_key, schedule.body, coalesce(schedule.headers, '{}'), schedule.task, false, first,
            '{}', 0, now())
    ON CONFLICT (name) DO UPDATE
    SET cron = EXCLUDED.cron, every = EXCLUDED.every, timezone = EXCLUDED.timezone, missed = EXCLUDED.missed,
        routing_key = EXCLUDED.routing_key, body = EXCLUDED.body, headers = EXCLUDED.headers,
        task = EXCLUDED.task,
        next_run_at = CASE WHEN schedule.first_run IS NOT NULL
                             OR (s.cron, s.every, s.timezone) IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.every, EXCLUDED.timezone)
                           THEN EXCLUDED.next_run_at ELSE s.next_run_at END
    RETURNING s.id INTO schedule_id;
    -- Woken, a dispatcher asks pgmb.next_wakeup again, which now counts this schedule.
    PERFORM pgmb.wake_dispatchers();
    RETURN schedule_id;
END $$;

-- Pauses schedule `name` (nothing fires until it is resumed); false if there is none.
CREATE OR REPLACE FUNCTION pgmb.pause_schedule(name text) RETURNS boolean
LANGUAGE sql AS $$
    UPDATE pgmb_schedule SET paused = true WHERE pgmb_schedule.name = pause_schedule.name RETURNING true
$$;

-- Resumes schedule `name`. Due times that passed while it was paused are missed runs, which
-- its `missed` policy handles at the next fire. False if there is none.
CREATE OR REPLACE FUNCTION pgmb.resume_schedule(name text) RETURNS boolean
LANGUAGE sql AS $$
    UPDATE pgmb_schedule SET paused = false WHERE pgmb_schedule.name = resume_schedule.name RETURNING true
$$;

-- Deletes schedule `name` (the messages it published stay); false if there was none.
CREATE OR REPLACE FUNCTION pgmb.unschedule(name text) RETURNS boolean
LANGUAGE sql AS $$
    DELETE FROM pgmb_schedule WHERE pgmb_schedule.name = unschedule.name RETURNING true
$$;

-- ---------------------------------------------------------------------------------------
-- Firing
-- ---------------------------------------------------------------------------------------

-- Fires what is due, up to `max_count` messages: each due schedule's row locked FOR UPDATE
-- SKIP LOCKED (another firer holding it fires it; a row it advanced and committed meanwhile
-- is no longer due when read again), its message published through pgmb.send (routing,
-- deduplication, wake-ups as for any message) under the id pgmb.schedule_message_id gives,
-- and the row advanced, in the caller's transaction. Runs missed (a later due time has
-- passed too) follow the schedule's policy: 'skip' fires none of them and goes on to the
-- first due time after now; 'once' fires one message, for the first missed due time, then
-- goes on after now; 'all' fires each, oldest first. A schedule whose message cannot be
-- published (its routing key's rule changed, say) records the error in last_error and
-- tries again an interval (or a minute) later: one schedule never stops the loop. Returns how many were published and, in
-- next_in, the seconds until the next look (0 when max_count was reached).
CREATE OR REPLACE FUNCTION pgmb.fire_due_schedules(max_count integer DEFAULT 100, OUT fired integer, OUT next_in float8)
LANGUAGE plpgsql AS $$
DECLARE
    s pgmb_schedule;
    now_ timestamptz;
    due timestamptz;
    later timestamptz;
    message_id uuid;
    published integer;
BEGIN
    fired := 0;
    FOR s IN SELECT * FROM pgmb_schedule
             WHERE NOT paused AND next_run_at <= clock_timestamp()
             ORDER BY next_run_at LIMIT max_count
             FOR UPDATE SKIP LOCKED LOOP
        published := 0;
        BEGIN
            now_ := clock_timestamp();
            due := s.next_run_at;
            later := pgmb.schedule_after(s, due, due);
            -- Each due time at most once per pass: 'all' catches up over later passes.
            IF later > now_ OR s.missed IN ('once', 'all') THEN
                message_id := pgmb.schedule_message_id(s.id, due);
                IF EXISTS (SELECT FROM pgmb_message WHERE id = message_id) THEN
                    NULL;
                ELSIF s.task IS NULL THEN
                    PERFORM pgmb.send(message_id, s.routing_key, s.body, s.headers, NULL::timestamptz);
                    published := 1;
                ELSIF pgmb.enqueue_task(message_id, s.routing_key, s.body,
                                        -coalesce((s.task ->> 'priority')::integer, 0),
                                        s.task ->> 'backend', s.task ->> 'task_path', s.task ->> 'queue_name',
                                        coalesce((s.task ->> 'priority')::integer, 0), NULL,
                                        coalesce(s.task -> 'args', '[]'), coalesce(s.task -> 'kwargs', '{}'),
                                        coalesce(s.headers, '{}')) IS NULL THEN
                    RAISE EXCEPTION 'no queue is bound to %: the task would never run', s.routing_key;
                ELSE
                    published := 1;
                END IF;
            END IF;
            IF later <= now_ AND s.missed <> 'all' THEN
                later := pgmb.schedule_after(s, due, now_);
            END IF;
            UPDATE pgmb_schedule
            SET next_run_at = later, runs = runs + published, last_error = NULL,
                last_runs = CASE WHEN published = 1 THEN (ARRAY[due] || last_runs)[1:10] ELSE last_runs END
            WHERE id = s.id;
        EXCEPTION WHEN others THEN
            UPDATE pgmb_schedule
            SET next_run_at = clock_timestamp() + coalesce(s.every, interval '1 minute'), last_error = SQLERRM
            WHERE id = s.id;
            RAISE WARNING 'pgmb: schedule "%" could not fire at %: %', s.name, due, SQLERRM;
        END;
        fired := fired + published;
    END LOOP;
    SELECT CASE WHEN fired >= max_count THEN 0
                ELSE greatest(0, extract(epoch FROM min(next_run_at) - clock_timestamp()))::float8 END
    INTO next_in
    FROM pgmb_schedule WHERE NOT paused;
END $$;

-- pgmb.fire_due_schedules' count alone, for a caller of SQL (a pg_cron job, psql).
CREATE OR REPLACE FUNCTION pgmb.fire_schedules(max_count integer DEFAULT 100) RETURNS integer
LANGUAGE sql AS $$ SELECT fired FROM pgmb.fire_due_schedules(max_count) $$;

-- The in-database loop's step: fires what is due and returns when to look next, at most
-- pgmb.indb_reclaim_interval() away (a schedule made meanwhile is seen by then, or sooner
-- through pgmb.next_wakeup).
CREATE OR REPLACE FUNCTION pgmb.loop_fire_schedules() RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    r := pgmb.fire_due_schedules(100);
    RETURN clock_timestamp() + least(coalesce(r.next_in * interval '1 second', pgmb.indb_reclaim_interval()),
                                     pgmb.indb_reclaim_interval());
EXCEPTION WHEN others THEN
    RAISE WARNING 'pgmb: could not fire schedules: %', SQLERRM;
    RETURN clock_timestamp() + pgmb.indb_reclaim_interval();
END $$;
