-- History partitioned by time (docs/decisions/0076-history-partitioned-by-message-day.md):
-- pgmb_message is partitioned by RANGE (id) and pgmb_attempt by RANGE (message_id), one
-- partition a UTC day of the message id's time (a UUID v7's first 48 bits), so that a
-- message's attempts live in its day and retention drops a day's two tables instead of
-- deleting its rows. Each table's DEFAULT partition takes every id no day holds: ids that
-- producers gave (any UUID), a clock past the days made and, in a database upgraded from
-- 0.1.x, every row stored before (the old table became the default partition). Nothing is
-- refused for want of a partition.

-- The id that starts a UTC day: its first 48 bits that day's first millisecond, the rest
-- zero. Day partitions are bounded by these.
CREATE OR REPLACE FUNCTION pgmb.day_floor(day date) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT encode(substring(int8send((extract(epoch FROM day::timestamp) * 1000)::bigint) FROM 3)
                  || '\x00000000000000000000'::bytea, 'hex')::uuid
$$;

-- The history tables and the column each is partitioned by.
CREATE OR REPLACE FUNCTION pgmb.history_tables() RETURNS TABLE (parent name, key name)
LANGUAGE sql IMMUTABLE
AS $$ VALUES ('pgmb_message'::name, 'id'::name), ('pgmb_attempt'::name, 'message_id'::name) $$;

-- Gives table `dst` the grants table `src` has (its owner's aside): a partition gets its
-- parent's, as pgmb.apply_access gives every pgmb_* table.
CREATE OR REPLACE FUNCTION pgmb.copy_table_grants(src regclass, dst regclass) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    i record;
BEGIN
    FOR i IN SELECT a.privilege_type, a.grantee FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = src AND a.grantee <> c.relowner LOOP
        EXECUTE format('GRANT %s ON %s TO %s', i.privilege_type, dst,
                       CASE WHEN i.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(i.grantee::regrole::text) END);
    END LOOP;
END $$;

-- Turns one of the history tables into a partitioned table, in constant time whatever it
-- holds: the table is renamed <table>_default (its indexes and statistics after it), a
-- partitioned table with its columns, defaults, checks, indexes, statistics, triggers and
-- grants is made under its name, and the old table attached as its DEFAULT partition (a
-- default partition is attached without a scan while it is the only one). The views over
-- it and the functions of its row type are made again for the new table. Does nothing if
-- the table is partitioned already.
CREATE OR REPLACE FUNCTION pgmb.partition_history_table(tbl name, key name) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    old regclass := tbl::regclass;
    part name := tbl || '_default';
    schema name := (SELECT relnamespace::regnamespace::name FROM pg_class WHERE oid = old);
    views text[];
    triggers text[];
    statistics text[];
    i record;
    g record;
    def text;
    seq_name name;
    seq_acl aclitem[];
    seq_owner name;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = old) = 'p' THEN
        RETURN;
    END IF;
    -- Printed before the rename, so that they name the table, not its old relation.
    views := ARRAY(SELECT DISTINCT format('CREATE OR REPLACE VIEW %s AS %s', v.oid::regclass,
                                          pg_get_viewdef(v.oid))
                   FROM pg_depend d JOIN pg_rewrite w ON w.oid = d.objid
                   JOIN pg_class v ON v.oid = w.ev_class
                   WHERE d.refobjid = old AND d.classid = 'pg_rewrite'::regclass AND v.oid <> old);
    triggers := ARRAY(SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t
                      WHERE t.tgrelid = old AND NOT t.tgisinternal ORDER BY t.tgname);
    statistics := ARRAY(SELECT pg_get_statisticsobjdef(s.oid) FROM pg_statistic_ext s WHERE s.stxrelid = old);
    FOR i IN SELECT s.stxnamespace::regnamespace::name AS nsp, s.stxname FROM pg_statistic_ext s
             WHERE s.stxrelid = old LOOP
        EXECUTE format('DROP STATISTICS %I.%I', i.nsp, i.stxname);
    END LOOP;
    FOR i IN SELECT t.tgname FROM pg_trigger t WHERE t.tgrelid = old AND NOT t.tgisinternal LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', i.tgname, old);
    END LOOP;

    EXECUTE format('ALTER TABLE %s RENAME TO %I', old, part);
    FOR i IN SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
             WHERE x.indrelid = old LOOP
        EXECUTE format('ALTER INDEX %I.%I RENAME TO %I', schema, i.relname,
                       part || substring(i.relname FROM length(tbl) + 1));
    END LOOP;
    EXECUTE format('CREATE TABLE %I.%I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS'
                   ' INCLUDING STORAGE INCLUDING COMMENTS) PARTITION BY RANGE (%I)',
                   schema, tbl, old, key);
    -- An identity column becomes a column of the parent drawing from a sequence of the
    -- same name, options, state, grants and owner (PostgreSQL 17 and later refuse to attach
    -- a table with an identity column as a partition; before 17 a partitioned table's
    -- identity is not its partitions'): rows go in through the parent, whose default counts.
    FOR i IN SELECT a.attname, pg_get_serial_sequence(old::text, a.attname)::regclass AS seq,
                    format_type(a.atttypid, a.atttypmod) AS kind
             FROM pg_attribute a WHERE a.attrelid = old AND a.attidentity <> '' LOOP
        SELECT c.relname, c.relacl, c.relowner::regrole::name INTO seq_name, seq_acl, seq_owner
        FROM pg_class c WHERE c.oid = i.seq;
        SELECT format('AS %s INCREMENT %s MINVALUE %s MAXVALUE %s START %s CACHE %s %s', i.kind,
                      q.seqincrement, q.seqmin, q.seqmax, q.seqstart, q.seqcache,
                      CASE WHEN q.seqcycle THEN 'CYCLE' ELSE 'NO CYCLE' END)
            INTO def FROM pg_sequence q WHERE q.seqrelid = i.seq;
        EXECUTE format('CREATE SEQUENCE %I.%I %s', schema, seq_name || '_new', def);
        EXECUTE format('SELECT setval(%L, last_value, is_called) FROM %s',
                       format('%I.%I', schema, seq_name || '_new'), i.seq);
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP IDENTITY', old, i.attname);
        EXECUTE format('ALTER SEQUENCE %I.%I RENAME TO %I', schema, seq_name || '_new', seq_name);
        EXECUTE format('ALTER SEQUENCE %I.%I OWNER TO %I', schema, seq_name, seq_owner);
        FOR g IN SELECT a.privilege_type, a.grantee FROM aclexplode(seq_acl) a
                 WHERE a.grantee <> (SELECT relowner FROM pg_class WHERE oid = old) LOOP
            EXECUTE format('GRANT %s ON SEQUENCE %I.%I TO %s', g.privilege_type, schema, seq_name,
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END);
        END LOOP;
        EXECUTE format('ALTER TABLE %I.%I ALTER COLUMN %I SET DEFAULT nextval(%L::regclass)', schema, tbl,
                       i.attname, format('%I.%I', schema, seq_name));
        EXECUTE format('ALTER SEQUENCE %I.%I OWNED BY %I.%I.%I', schema, seq_name, schema, tbl, i.attname);
    END LOOP;
    -- The primary key where it holds the partition key (the message's id); the attempt's
    -- id stays unique in each partition and, drawn from one sequence, in all.
    FOR i IN SELECT x.indexrelid, pg_get_constraintdef(c.oid) AS def FROM pg_index x
             JOIN pg_constraint c ON c.conindid = x.indexrelid AND c.contype = 'p'
             WHERE x.indrelid = old AND (SELECT attnum FROM pg_attribute WHERE attrelid = old AND attname = key)
                                        = ANY (x.indkey::int2[]) LOOP
        EXECUTE format('ALTER TABLE %I.%I ADD CONSTRAINT %I %s', schema, tbl, tbl || '_pkey', i.def);
    END LOOP;
    FOR i IN SELECT c.relname, pg_get_indexdef(x.indexrelid) AS def FROM pg_index x
             JOIN pg_class c ON c.oid = x.indexrelid
             WHERE x.indrelid = old AND NOT x.indisprimary LOOP
        def := regexp_replace(i.def, '^CREATE (UNIQUE )?INDEX \S+ ON \S+ ',
                              format('CREATE \1INDEX %I ON %I.%I ', tbl || substring(i.relname FROM length(part) + 1),
                                     schema, tbl));
        EXECUTE def;
    END LOOP;
    EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %s DEFAULT', schema, tbl, old);
    EXECUTE format('ALTER TABLE %I.%I OWNER TO %I', schema, tbl,
                   (SELECT relowner::regrole::name FROM pg_class WHERE oid = old));
    PERFORM pgmb.copy_table_grants(old, format('%I.%I', schema, tbl)::regclass);
    FOREACH def IN ARRAY statistics LOOP
        EXECUTE def;
    END LOOP;
    FOREACH def IN ARRAY triggers LOOP
        EXECUTE def;
    END LOOP;
    FOREACH def IN ARRAY views LOOP
        EXECUTE def;
    END LOOP;
    -- A function of the old row type now takes the default partition's: made again for
    -- the table's, with the old one's grants, and the old one dropped.
    FOR i IN SELECT p.oid, p.proname, p.pronamespace, p.proacl FROM pg_proc p
             WHERE (SELECT reltype FROM pg_class WHERE oid = old) = ANY (p.proargtypes::oid[]) LOOP
        def := pg_get_functiondef(i.oid);
        EXECUTE format('DROP FUNCTION %s', i.oid::regprocedure);
        EXECUTE replace(def, part, tbl);
        SELECT p.oid INTO i.oid FROM pg_proc p
        WHERE p.proname = i.proname AND p.pronamespace = i.pronamespace
          AND (SELECT reltype FROM pg_class WHERE relname = tbl AND relnamespace = schema::regnamespace)
              = ANY (p.proargtypes::oid[]);
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', i.oid::regprocedure);
        FOR g IN SELECT a.grantee FROM aclexplode(i.proacl) a
                 WHERE a.grantee <> (SELECT proowner FROM pg_proc WHERE oid = i.oid) LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', i.oid::regprocedure,
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END);
        END LOOP;
    END LOOP;
END $$;

-- Ids from this day on go to each table's far partition (<table>_far): a producer's UUID
-- v4 mostly falls there (its first 48 bits are random, and 98.5 % of their values lie past
-- this day's), which keeps such ids out of the default partition. pgmb's own ids reach it
-- in the year 2100, and go on being stored there.
CREATE OR REPLACE FUNCTION pgmb.history_far_day() RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT date '2100-01-01' $$;

-- Making partitions reads the default partition once under its ACCESS EXCLUSIVE lock (a
-- new partition's range must be proven absent from it), and every statement that reaches
-- the default (claims' generic plans lock every partition) waits meanwhile: about 0.6 s
-- a million rows on the machine of docs/benchmarks.md. Days are made automatically only
-- while each default partition holds at most this many rows by its statistics; above it,
-- by an operator who passes a higher limit (manage.py pgmb_history premake --scan-limit).
CREATE OR REPLACE FUNCTION pgmb.history_scan_limit() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 1000000::bigint $$;

-- The day partitions there are: each table's, its day and bounds, oldest first.
CREATE OR REPLACE FUNCTION pgmb.history_days()
RETURNS TABLE (parent name, partition name, day date, low uuid, high uuid)
LANGUAGE sql STABLE
AS $$
    SELECT h.parent, c.relname, to_date(right(c.relname, 8), 'YYYYMMDD'),
           pgmb.day_floor(to_date(right(c.relname, 8), 'YYYYMMDD')),
           pgmb.day_floor(to_date(right(c.relname, 8), 'YYYYMMDD') + 1)
    FROM pgmb.history_tables() h
    JOIN pg_inherits i ON i.inhparent = h.parent::regclass
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE c.relname ~ '_p[0-9]{8}$'
    ORDER BY 3, 1
$$;

-- The rows a default partition holds by its statistics (by its size, at 100 bytes a row,
-- before it was ever analyzed).
CREATE OR REPLACE FUNCTION pgmb.estimated_rows(tbl regclass) RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint ELSE pg_relation_size(c.oid) / 100 END
    FROM pg_class c WHERE c.oid = tbl
$$;

-- How many rows of [low, high) table `tbl` holds (high NULL: no end), counting at most
-- `most` + 1: read by its index on `key`.
CREATE OR REPLACE FUNCTION pgmb.rows_between(tbl regclass, key name, low uuid, high uuid, most bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    found bigint;
BEGIN
    EXECUTE format('SELECT count(*) FROM (SELECT FROM %s WHERE %I >= $1 AND ($2 IS NULL OR %I < $2) LIMIT $3) AS r',
                   tbl, key, key)
        INTO found USING low, high, most + 1;
    RETURN found;
END $$;

-- Makes the partitions of the UTC days from `first` to `last` and the far partitions, of
-- both history tables, that do not exist yet; returns how many tables it made. Rows of
-- their ranges already in the default partition (ids that producers gave, or a day that
-- began before its partition was made) move into them, unless a range has more than
-- 10,000: moving them would hold the locks as long, so that range is left out (its rows,
-- and new ones, stay in the default partition). Does nothing, and says so in a NOTICE,
-- while a default partition holds more than `scan_limit` rows (NULL: no limit), or while
-- its locks are not had within a second (the next run tries again): publishing and claims
-- never wait longer for it. Both tables' partitions are made in one transaction: a
-- message's attempts go where it goes.
CREATE OR REPLACE FUNCTION pgmb.make_history_days(first date, last date,
                                                  scan_limit bigint DEFAULT pgmb.history_scan_limit())
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    h record;
    parents name[];
    parts name[];
    lows uuid[];
    highs uuid[];
    over text;
    crowded text[];
    most_moved CONSTANT bigint := 10000;
    lock_wait text := current_setting('lock_timeout');
    checks text[];
    made integer := 0;
BEGIN
    IF first IS NULL OR last IS NULL THEN
        RAISE EXCEPTION 'invalid days % to %: both must be given', first, last
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(t.parent), array_agg(n.partition), array_agg(n.low), array_agg(n.high)
        INTO parents, parts, lows, highs
    FROM pgmb.history_tables() t,
         LATERAL (SELECT format('%s_p%s', t.parent, to_char(g, 'YYYYMMDD')) AS partition,
                         pgmb.day_floor(g::date) AS low, pgmb.day_floor(g::date + 1) AS high
                  FROM generate_series(first, least(last, pgmb.history_far_day() - 1), interval '1 day') AS g
                  UNION ALL
                  SELECT t.parent || '_far', pgmb.day_floor(pgmb.history_far_day()), NULL) AS n
    WHERE to_regclass(quote_ident(n.partition)) IS NULL;
    IF parts IS NULL THEN
        RETURN 0;
    END IF;
    SELECT string_agg(format('%s holds about %s rows', t.parent || '_default',
                             pgmb.estimated_rows((t.parent || '_default')::regclass)), ', ')
        INTO over
    FROM pgmb.history_tables() t
    WHERE pgmb.estimated_rows((t.parent || '_default')::regclass) > scan_limit;
    IF over IS NOT NULL THEN
        RAISE NOTICE 'pgmb: history partitions not made: % (the limit is %: a higher one holds its lock longer)',
            over, scan_limit;
        RETURN 0;
    END IF;
    -- Every lock first, parents before their default partitions (the order a publish
    -- takes them in); a wait past a second gives up rather than queue publishers behind it.
    PERFORM set_config('lock_timeout', '1s', true);
    BEGIN
        FOR h IN SELECT * FROM pgmb.history_tables() LOOP
            EXECUTE format('LOCK TABLE ONLY %I IN SHARE UPDATE EXCLUSIVE MODE', h.parent);
        END LOOP;
        FOR h IN SELECT * FROM pgmb.history_tables() LOOP
            EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', h.parent || '_default');
        END LOOP;
    EXCEPTION WHEN lock_not_available THEN
        PERFORM set_config('lock_timeout', lock_wait, true);
        RAISE NOTICE 'pgmb: history partitions not made: their tables were busy (the next run tries again)';
        RETURN 0;
    END;
    PERFORM set_config('lock_timeout', lock_wait, true);
    -- Ranges left out for both tables alike, by their names' suffix (_pYYYYMMDD, _far).
    crowded := ARRAY(SELECT substring(n.partition FROM length(n.parent) + 1)
                     FROM unnest(parents, parts, lows, highs) AS n(parent, partition, low, high)
                     JOIN pgmb.history_tables() t ON t.parent = n.parent
                     WHERE pgmb.rows_between((n.parent || '_default')::regclass, t.key, n.low, n.high,
                                             most_moved) > most_moved);
    IF cardinality(crowded) > 0 THEN
        RAISE NOTICE 'pgmb: history partitions not made: %, whose rows the default partition already holds more than % of',
            array_to_string(crowded, ', '), most_moved;
        SELECT array_agg(n.parent ORDER BY n.i), array_agg(n.partition ORDER BY n.i),
               array_agg(n.low ORDER BY n.i), array_agg(n.high ORDER BY n.i)
            INTO parents, parts, lows, highs
        FROM unnest(parents, parts, lows, highs) WITH ORDINALITY AS n(parent, partition, low, high, i)
        WHERE substring(n.partition FROM length(n.parent) + 1) <> ALL (crowded);
        IF parts IS NULL THEN
            RETURN 0;
        END IF;
    END IF;
    FOR h IN SELECT * FROM pgmb.history_tables() LOOP
        checks := '{}';
        FOR i IN 1 .. cardinality(parts) LOOP
            CONTINUE WHEN parents[i] <> h.parent;
            EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)',
                           parts[i], h.parent);
            PERFORM pgmb.copy_table_grants(h.parent::regclass, parts[i]::regclass);
            -- Found by the default partition's index: few rows, if any.
            EXECUTE format('WITH moved AS (DELETE FROM %I WHERE %I >= $1 AND ($2 IS NULL OR %I < $2) RETURNING *)'
                           ' INSERT INTO %I SELECT * FROM moved',
                           h.parent || '_default', h.key, h.key, parts[i])
                USING lows[i], highs[i];
            checks := checks || format('ADD CONSTRAINT %I CHECK (%s)', parts[i] || '_new',
                                       CASE WHEN highs[i] IS NULL THEN format('%I < %L', h.key, lows[i])
                                            ELSE format('%I < %L OR %I >= %L', h.key, lows[i], h.key, highs[i]) END);
        END LOOP;
        CONTINUE WHEN cardinality(checks) = 0;
        -- One read of the default partition proves every new range absent from it (one
        -- ALTER TABLE checks all its constraints in one scan): the ATTACHes read nothing.
        EXECUTE format('ALTER TABLE %I %s', h.parent || '_default', array_to_string(checks, ', '));
        FOR i IN 1 .. cardinality(parts) LOOP
            CONTINUE WHEN parents[i] <> h.parent;
            EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%s)',
                           h.parent, parts[i], lows[i], coalesce(quote_literal(highs[i]), 'MAXVALUE'));
            EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', h.parent || '_default', parts[i] || '_new');
            made := made + 1;
        END LOOP;
    END LOOP;
    RETURN made;
END $$;

-- Makes the partitions of today and the `days` days after it (UTC), and the far
-- partitions, that do not exist yet (pgmb.make_history_days); returns how many tables it
-- made. `days` is PGMB['HISTORY_PREMAKE_DAYS'] (pgmb.conf) when Python calls it, this
-- default otherwise (pgmb.maintenance, pg_cron; tests/python compares the two).
CREATE OR REPLACE FUNCTION pgmb.premake_history(days integer DEFAULT 3,
                                                scan_limit bigint DEFAULT pgmb.history_scan_limit())
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
BEGIN
    IF days IS NULL OR days < 0 THEN
        RAISE EXCEPTION 'invalid days %: it must be 0 or more', days USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN pgmb.make_history_days(today, today + days, scan_limit);
END $$;

-- Retention: the day partitions whose day ended before now() - older_than, oldest
-- first. A day with no unfinished message (a live delivery or a dead letter) is dropped,
-- both its tables; a day with some is emptied of the rest (TRUNCATE) and keeps those
-- messages and their attempts, and is dropped by a later run once they are finished.
-- The default partition is never touched: its rows leave as the archive job deletes
-- them. Returns each day retired, the messages and attempts it removed (counted only if
-- `count_rows`: a count reads the day's tables, which dropping them does not), and the
-- messages kept.
CREATE OR REPLACE FUNCTION pgmb.retire_history(older_than interval, count_rows boolean DEFAULT false)
RETURNS TABLE (day date, messages bigint, attempts bigint, kept bigint)
LANGUAGE plpgsql AS $$
DECLARE
    d record;
    keep uuid[];
    message_part name;
    attempt_part name;
    kept_attempts bigint;
BEGIN
    IF older_than IS NULL OR older_than < interval '0' THEN
        RAISE EXCEPTION 'invalid age %: it must be 0 or more', older_than USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR d IN SELECT DISTINCT h.day, h.low, h.high FROM pgmb.history_days() h
             WHERE (h.day + 1)::timestamp AT TIME ZONE 'UTC' <= now() - older_than
             ORDER BY h.day LOOP
        message_part := format('pgmb_message_p%s', to_char(d.day, 'YYYYMMDD'));
        attempt_part := format('pgmb_attempt_p%s', to_char(d.day, 'YYYYMMDD'));
        keep := ARRAY(SELECT x.message_id FROM pgmb_delivery x WHERE x.message_id >= d.low AND x.message_id < d.high
                      UNION
                      SELECT x.message_id FROM pgmb_dead_letter x WHERE x.message_id >= d.low AND x.message_id < d.high);
        day := d.day;
        kept := cardinality(keep);
        messages := NULL;
        attempts := NULL;
        IF count_rows THEN
            EXECUTE format('SELECT count(*) FROM %I', message_part) INTO messages;
            EXECUTE format('SELECT count(*) FROM %I', attempt_part) INTO attempts;
        END IF;
        IF kept = 0 THEN
            EXECUTE format('DROP TABLE %I, %I', message_part, attempt_part);
        ELSE
            -- The kept rows go back into their own day's tables, as they were: not through
            -- the parent, whose triggers would route and check them again.
            CREATE TEMP TABLE pgmb_kept_messages ON COMMIT DROP AS SELECT * FROM pgmb_message WHERE false;
            CREATE TEMP TABLE pgmb_kept_attempts ON COMMIT DROP AS SELECT * FROM pgmb_attempt WHERE false;
            EXECUTE format('INSERT INTO pgmb_kept_messages SELECT * FROM %I WHERE id = ANY ($1)', message_part) USING keep;
            EXECUTE format('INSERT INTO pgmb_kept_attempts SELECT * FROM %I WHERE message_id = ANY ($1)', attempt_part)
                USING keep;
            GET DIAGNOSTICS kept_attempts = ROW_COUNT;
            messages := messages - kept;
            attempts := attempts - kept_attempts;
            EXECUTE format('TRUNCATE %I, %I', message_part, attempt_part);
            EXECUTE format('ALTER TABLE %I DISABLE TRIGGER USER', message_part);
            EXECUTE format('INSERT INTO %I SELECT * FROM pgmb_kept_messages', message_part);
            EXECUTE format('ALTER TABLE %I ENABLE TRIGGER USER', message_part);
            EXECUTE format('INSERT INTO %I SELECT * FROM pgmb_kept_attempts', attempt_part);
            DROP TABLE pgmb_kept_messages, pgmb_kept_attempts;
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

-- The archive job takes a day whole (pgmb/pipeline/archive.py,
-- docs/decisions/0079-the-archive-takes-whole-days.md): day `day`'s two partitions,
-- whose day ended before `cutoff`, are detached from pgmb_message and pgmb_attempt and
-- renamed pgmb_archive_<run>_message_<YYYYMMDD> and pgmb_archive_<run>_attempt_<YYYYMMDD>,
-- which run `run` then reads whole and drops once its Parquet is committed. The messages
-- the archive keeps (the rule of its row by row claims, archive.sql: a live delivery, a
-- dead letter, published or last attempted at or after the cutoff) move with their
-- attempts into the default partitions first, where they go on as before. The day is
-- recorded in pgmb_archive_day. One short transaction, whose locks (the parents' ACCESS
-- EXCLUSIVE: every publish, claim and settle waits meanwhile) are had within a second or
-- not at all: then nothing is done and NULL returned (the next run tries again). Returns
-- the messages kept.
CREATE OR REPLACE FUNCTION pgmb.claim_history_day(run bigint, day date, cutoff timestamptz)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    low uuid := pgmb.day_floor(day);
    high uuid := pgmb.day_floor(day + 1);
    message_part name := format('pgmb_message_p%s', to_char(day, 'YYYYMMDD'));
    attempt_part name := format('pgmb_attempt_p%s', to_char(day, 'YYYYMMDD'));
    message_table name := format('pgmb_archive_%s_message_%s', run, to_char(day, 'YYYYMMDD'));
    attempt_table name := format('pgmb_archive_%s_attempt_%s', run, to_char(day, 'YYYYMMDD'));
    message_default CONSTANT name := 'pgmb_message_default';
    attempt_default CONSTANT name := 'pgmb_attempt_default';
    lock_wait text := current_setting('lock_timeout');
    keep uuid[];
BEGIN
    IF run IS NULL OR day IS NULL OR cutoff IS NULL OR (day + 1)::timestamp AT TIME ZONE 'UTC' > cutoff THEN
        RAISE EXCEPTION 'invalid day % for cutoff %: the day must end before it', day, cutoff
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The claim lock first, as the row by row claims take it (a pgmb.replay in progress
    -- commits its deliveries first), then the parents before their partitions (the order
    -- a publish takes them in).
    PERFORM set_config('lock_timeout', '1s', true);
    BEGIN
        PERFORM pg_advisory_xact_lock(pgmb.archive_lock_key('claim'));
        LOCK TABLE ONLY pgmb_message, pgmb_attempt IN ACCESS EXCLUSIVE MODE;
        IF to_regclass(quote_ident(message_part)) IS NULL OR to_regclass(quote_ident(attempt_part)) IS NULL THEN
            PERFORM set_config('lock_timeout', lock_wait, true);
            RETURN NULL;
        END IF;
        EXECUTE format('LOCK TABLE %I, %I, %I, %I IN ACCESS EXCLUSIVE MODE',
                       message_part, attempt_part, message_default, attempt_default);
    EXCEPTION WHEN lock_not_available THEN
        PERFORM set_config('lock_timeout', lock_wait, true);
        RETURN NULL;
    END;
    PERFORM set_config('lock_timeout', lock_wait, true);
    -- The deliveries and dead letters by their message index, the day's late rows by the
    -- created_at indexes: a few rows whatever the day's size.
    EXECUTE format('SELECT ARRAY(SELECT x.message_id FROM pgmb_delivery x WHERE x.message_id >= $1 AND x.message_id < $2'
                   ' UNION SELECT x.message_id FROM pgmb_dead_letter x WHERE x.message_id >= $1 AND x.message_id < $2'
                   ' UNION SELECT m.id FROM %I m WHERE m.created_at >= $3'
                   ' UNION SELECT a.message_id FROM %I a WHERE a.created_at >= $3)',
                   message_part, attempt_part)
        INTO keep USING low, high, cutoff;
    EXECUTE format('ALTER TABLE pgmb_message DETACH PARTITION %I', message_part);
    EXECUTE format('ALTER TABLE pgmb_attempt DETACH PARTITION %I', attempt_part);
    EXECUTE format('ALTER TABLE %I RENAME TO %I', message_part, message_table);
    EXECUTE format('ALTER TABLE %I RENAME TO %I', attempt_part, attempt_table);
    IF cardinality(keep) > 0 THEN
        -- Straight into the default partitions, which now hold the day's range: not
        -- through the parents, whose triggers would route and check them again.
        EXECUTE format('ALTER TABLE %I DISABLE TRIGGER USER', message_default);
        EXECUTE format('WITH moved AS (DELETE FROM %I WHERE id = ANY ($1) RETURNING *)'
                       ' INSERT INTO %I SELECT * FROM moved', message_table, message_default) USING keep;
        EXECUTE format('ALTER TABLE %I ENABLE TRIGGER USER', message_default);
        EXECUTE format('WITH moved AS (DELETE FROM %I WHERE message_id = ANY ($1) RETURNING *)'
                       ' INSERT INTO %I SELECT * FROM moved', attempt_table, attempt_default) USING keep;
    END IF;
    INSERT INTO pgmb_archive_day (run_id, day, message_table, attempt_table, kept)
    VALUES (run, day, message_table, attempt_table, cardinality(keep));
    RETURN cardinality(keep);
END $$;

SELECT pgmb.partition_history_table(h.parent, h.key) FROM pgmb.history_tables() h;
SELECT pgmb.premake_history(3);
