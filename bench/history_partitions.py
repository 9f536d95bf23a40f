"""PROTOTYPE (issue 28, decision 0076): what turning the history tables into partitioned
tables costs, measured before the migration is written.

    scripts/with-cluster.sh .venv/bin/python bench/history_partitions.py --stored 1000000

A scratch database is migrated, given ``--stored`` finished messages over ``--days`` days
(each with its ack attempt, ``bench/scale.py``'s fill) and cloned once per design:

- ``default``: in one transaction (the migration's, every lock held to its end), each table
  renamed, a partitioned table made in its place with its indexes, the old table attached
  as its DEFAULT partition; then a day partition for the day after tomorrow created, which
  scans the default partition under its ACCESS EXCLUSIVE lock.
- ``checked``: first, outside the migration, a ``CHECK`` on the old table that leaves the
  days ahead out, added ``NOT VALID`` and validated (SHARE UPDATE EXCLUSIVE: writers go
  on); then the same transaction, and the day partition attached with that proof, no scan.
- retention: in the ``checked`` clone, a day partition filled with a day's messages (as
  many as the fill's oldest day) and their attempts, one message with a live delivery and
  one dead-lettered among them; the day retired (the unfinished ones moved to the kept
  partition, the day's tables dropped), timed, next to the oldest day of the old table
  deleted by ``DELETE`` (one statement).

Each step's time is printed; nothing is asserted. The SQL is the migration's draft, and it
converts plain tables: run it from a checkout of commit 22d8e3e (before the history was
partitioned); on later trees the migration has converted them already.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import endpoints, harness, scale  # noqa: E402

#: The uuid that starts a UTC day: its first 48 bits are the day's first millisecond.
DAY_FLOOR = """
CREATE OR REPLACE FUNCTION pg_temp.day_floor(day date) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $$
    SELECT encode(substring(int8send((extract(epoch FROM day::timestamp) * 1000)::bigint) FROM 3)
                  || '\\x00000000000000000000'::bytea, 'hex')::uuid
$$
"""

#: Each table renamed, its indexes renamed after it, a partitioned table with the same
#: columns, defaults, checks and indexes made in its place; the old one attached as DEFAULT.
CONVERT = """
CREATE OR REPLACE FUNCTION pg_temp.partition_table(tbl text, key text, pk text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    legacy text := tbl || '_legacy';
    i record;
BEGIN
    EXECUTE format('ALTER TABLE %I RENAME TO %I', tbl, legacy);
    FOR i IN SELECT c.relname, pg_get_indexdef(x.indexrelid) AS def, x.indisprimary
             FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
             WHERE x.indrelid = legacy::regclass LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', i.relname, i.relname || '_legacy');
    END LOOP;
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS'
                   ' INCLUDING STORAGE INCLUDING GENERATED INCLUDING IDENTITY)'
                   ' PARTITION BY RANGE (%I)', tbl, legacy, key);
    -- The proof that the old table holds none of the days ahead is the old table's alone.
    IF EXISTS (SELECT FROM pg_constraint WHERE conrelid = tbl::regclass
               AND conname = tbl || '_before_days') THEN
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', tbl, tbl || '_before_days');
    END IF;
    IF pk IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %I ADD PRIMARY KEY (%s)', tbl, pk);
    END IF;
    FOR i IN SELECT c.relname, pg_get_indexdef(x.indexrelid) AS def
             FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
             WHERE x.indrelid = legacy::regclass AND NOT x.indisprimary LOOP
        EXECUTE replace(replace(i.def, ' ' || i.relname || ' ', ' ' || left(i.relname, -7) || ' '),
                        ' ON public.' || legacy || ' ', ' ON public.' || tbl || ' ');
    END LOOP;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I DEFAULT', tbl, legacy);
END $$
"""

DAY_PARTITION = """
CREATE TABLE {name} PARTITION OF {parent}
FOR VALUES FROM ('{low}') TO ('{high}')
"""


def timed(conn: psycopg.Connection[Any], statement: str, params: Any = None) -> float:
    start = time.perf_counter()
    conn.execute(statement, params)
    return time.perf_counter() - start


def bounds(conn: psycopg.Connection[Any], days_ahead: int) -> tuple[str, str]:
    low, high = conn.execute(
        "SELECT pg_temp.day_floor(current_date + %s), pg_temp.day_floor(current_date + %s)",
        (days_ahead, days_ahead + 1),
    ).fetchone()
    return str(low), str(high)


def convert(conn: psycopg.Connection[Any]) -> float:
    """The migration's transaction: both tables, every lock held until COMMIT."""
    conn.execute(DAY_FLOOR)
    conn.execute(CONVERT)
    start = time.perf_counter()
    with conn.transaction():
        conn.execute("LOCK TABLE pgmb_message, pgmb_attempt IN ACCESS EXCLUSIVE MODE")
        conn.execute("SELECT pg_temp.partition_table('pgmb_message', 'id', 'id')")
        conn.execute("SELECT pg_temp.partition_table('pgmb_attempt', 'message_id', NULL)")
    return time.perf_counter() - start


def add_day(conn: psycopg.Connection[Any], days_ahead: int) -> float:
    low, high = bounds(conn, days_ahead)
    start = time.perf_counter()
    with conn.transaction():
        for parent in ("pgmb_message", "pgmb_attempt"):
            conn.execute(
                DAY_PARTITION.format(
                    name=f"{parent}_d{days_ahead}", parent=parent, low=low, high=high
                )
            )
    return time.perf_counter() - start


def check_first(conn: psycopg.Connection[Any], days_ahead: int) -> tuple[float, float]:
    """The old tables proven free of the days ahead: (add NOT VALID, VALIDATE) seconds."""
    low, _ = bounds(conn, days_ahead)
    added = validated = 0.0
    for table, key in (("pgmb_message", "id"), ("pgmb_attempt", "message_id")):
        added += timed(
            conn,
            f"ALTER TABLE {table} ADD CONSTRAINT {table}_before_days"
            f" CHECK ({key} < '{low}') NOT VALID",
        )
        validated += timed(conn, f"ALTER TABLE {table} VALIDATE CONSTRAINT {table}_before_days")
    return added, validated


def retire_day(conn: psycopg.Connection[Any], days_ahead: int, count: int) -> dict[str, float]:
    """A day partition filled with ``count`` finished messages, two of them unfinished; its
    unfinished messages (and their attempts) moved to a kept partition, the day dropped."""
    low, high = bounds(conn, days_ahead)
    (queue,) = conn.execute("SELECT id FROM pgmb_queue WHERE name = %s", (scale.QUEUE,)).fetchone()
    conn.execute("SET session_replication_role = replica")
    conn.execute(
        """
        INSERT INTO pgmb_message (id, routing_key, body, created_at, available_at)
        SELECT encode(substring(uuid_send(%(low)s::uuid) FROM 1 FOR 6)
                      || substring(uuid_send(gen_random_uuid()) FROM 7), 'hex')::uuid,
               'order.created', '{"n": 1}', now(), now()
        FROM generate_series(1, %(count)s)
        """,
        {"low": low, "count": count},
    )
    conn.execute(
        "INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code,"
        " duration_ms, error, created_at)"
        " SELECT id, %s, 1, 'ack', 200, 1.0, '', now() FROM pgmb_message"
        " WHERE id >= %s AND id < %s",
        (queue, low, high),
    )
    unfinished = [
        r[0]
        for r in conn.execute(
            "SELECT id FROM pgmb_message WHERE id >= %s AND id < %s LIMIT 2", (low, high)
        )
    ]
    conn.execute(
        "INSERT INTO pgmb_delivery (message_id, queue_id, available_at) VALUES (%s, %s, now())",
        (unfinished[0], queue),
    )
    conn.execute(
        "INSERT INTO pgmb_dead_letter (message_id, queue_id, attempts, last_error)"
        " VALUES (%s, %s, 3, 'x')",
        (unfinished[1], queue),
    )
    conn.execute("RESET session_replication_role")
    conn.execute("VACUUM ANALYZE pgmb_message, pgmb_attempt")
    conn.execute("CHECKPOINT")
    day_m, day_a = f"pgmb_message_d{days_ahead}", f"pgmb_attempt_d{days_ahead}"
    start = time.perf_counter()
    with conn.transaction():
        conn.execute(f"ALTER TABLE pgmb_message DETACH PARTITION {day_m}")
        conn.execute(f"ALTER TABLE pgmb_attempt DETACH PARTITION {day_a}")
        conn.execute(
            """
            CREATE TEMP TABLE keep ON COMMIT DROP AS
            SELECT d.message_id FROM pgmb_delivery d
            WHERE d.message_id >= %(low)s AND d.message_id < %(high)s
            UNION SELECT x.message_id FROM pgmb_dead_letter x
                  WHERE x.message_id >= %(low)s AND x.message_id < %(high)s
            """,
            {"low": low, "high": high},
        )
        conn.execute(f"CREATE TABLE pgmb_message_kept (LIKE {day_m} INCLUDING ALL)")
        conn.execute(f"CREATE TABLE pgmb_attempt_kept (LIKE {day_a} INCLUDING ALL)")
        conn.execute(
            f"INSERT INTO pgmb_message_kept SELECT m.* FROM {day_m} m"
            " JOIN keep k ON k.message_id = m.id"
        )
        conn.execute(
            f"INSERT INTO pgmb_attempt_kept SELECT a.* FROM {day_a} a"
            " JOIN keep k ON k.message_id = a.message_id"
        )
        conn.execute(f"DROP TABLE {day_m}, {day_a}")
        conn.execute(
            f"ALTER TABLE pgmb_message ATTACH PARTITION pgmb_message_kept"
            f" FOR VALUES FROM ('{low}') TO ('{high}')"
        )
        conn.execute(
            f"ALTER TABLE pgmb_attempt ATTACH PARTITION pgmb_attempt_kept"
            f" FOR VALUES FROM ('{low}') TO ('{high}')"
        )
    drop = time.perf_counter() - start
    (kept,) = conn.execute("SELECT count(*) FROM pgmb_message_kept").fetchone()
    if kept != 2:
        raise RuntimeError(f"kept {kept} messages, not 2")
    # The baseline: the oldest day of the old table, one DELETE each (attempts, messages).
    start = time.perf_counter()
    with conn.transaction():
        conn.execute(
            "CREATE TEMP TABLE oldest ON COMMIT DROP AS SELECT id FROM pgmb_message_legacy"
            " WHERE created_at < (SELECT min(created_at) FROM pgmb_message_legacy)"
            " + interval '1 day'"
        )
        conn.execute("DELETE FROM pgmb_attempt a USING oldest o WHERE a.message_id = o.id")
        conn.execute("DELETE FROM pgmb_message m USING oldest o WHERE m.id = o.id")
    delete = time.perf_counter() - start
    return {"drop_s": drop, "delete_s": delete}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stored", type=int, default=1_000_000)
    parser.add_argument("--days", type=float, default=10.0)
    parser.add_argument("--db", default="pgmb_bench_history")
    args = parser.parse_args(argv)
    per_day = int(args.stored / args.days)
    with endpoints.fast_endpoint() as fast, harness.scratch_database(args.db):
        scale.set_up(fast.url())
        with harness.connect(args.db) as conn:
            scale.fill_stored(
                conn, args.stored, spacing_ms=args.days * 86_400_000 / args.stored, acked=True
            )
        with scale.clones(args.db, ("default", "checked"), keep=False) as db:
            with harness.connect(db["default"]) as conn:
                t = convert(conn)
                print(f"default: conversion transaction {t:.3f} s", flush=True)
                t = add_day(conn, 2)
                print(f"default: a day partition made (default scanned) {t:.3f} s", flush=True)
            with harness.connect(db["checked"]) as conn:
                conn.execute(DAY_FLOOR)
                added, validated = check_first(conn, 2)
                print(f"checked: CHECK added NOT VALID {added:.3f} s, validated {validated:.3f} s")
                t = convert(conn)
                print(f"checked: conversion transaction {t:.3f} s", flush=True)
                t = add_day(conn, 2)
                print(f"checked: a day partition made (proof, no scan) {t:.3f} s", flush=True)
                r = retire_day(conn, 2, per_day)
                print(
                    f"retention of {per_day:,} messages and attempts: partition retired "
                    f"{r['drop_s']:.3f} s; the oldest day DELETEd {r['delete_s']:.3f} s",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
