"""The ``publish`` job: datasets published into pgmb through Spark, routed, exactly once
per id; every kind of bad input refused in one line with the database untouched."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import socket
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

import pgmb
from pgmb import sql as queries
from pgmb.errors import PipelineError
from pgmb.pipeline.publish_input import input_format
from pgmb.pipeline.publish_rows import CHECKED, Plan, json_problem, limits_problem, problem
from pgmb.routing import compile_binding, matches

from .conftest import MASTER

ROWS = 100_000
KEYS = ("order.created", "order.paid", "order.eu.shipped", "invoice.paid", "user.deleted")
#: Queue name -> binding key; "user.deleted" matches none of them.
BINDINGS = {"orders": "order.*", "all_orders": "order.#", "paid": "*.paid", "audit": "audit.#"}


def event_id(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-{n:012x}"


def routed(key: str) -> list[str]:
    """The queues that pgmb's routing rules send ``key`` to."""
    return [name for name, b in BINDINGS.items() if matches(compile_binding(b), key)]


def table_counts() -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM pgmb_message), (SELECT count(*) FROM pgmb_delivery)"
        )
        return cursor.fetchone()


def fetch(statement: str, params: tuple = ()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall()


def summary(report: str) -> dict[str, int]:
    """The figures of the summary line."""
    line = next(li for li in report.splitlines() if " rows read, " in li)
    figures = dict(
        (name, int(value.replace(",", "")))
        for value, name in re.findall(
            r"([\d,]+) (rows read|published|skipped as duplicates|deliveries routed)", line
        )
    )
    return figures


@pytest.fixture
def queues(make_worker, make_queue):
    worker = make_worker()
    return {name: make_queue(b, name=name, worker=worker) for name, b in BINDINGS.items()}


@pytest.fixture(scope="module")
def events_parquet(tmp_path_factory) -> str:
    """ROWS events in three Parquet files, written by Spark: event_id (a UUID), topic,
    payload (a struct with an explicit null), meta (a map), wait (seconds)."""
    from pyspark.sql import functions as F

    from pgmb.pipeline.spark import session

    path = str(tmp_path_factory.mktemp("publish") / "events.parquet")
    # As the jobs make theirs: the first session starts the JVM that later ones share, and
    # only a JVM started with the JDBC driver's jar can load it.
    spark = session("tests", MASTER, {}, None)
    try:
        n = F.col("id")
        spark.range(ROWS).select(
            F.format_string("%08x-0000-4000-8000-%012x", n, n).alias("event_id"),
            F.element_at(F.array(*map(F.lit, KEYS)), (n % len(KEYS) + 1).cast("int")).alias(
                "topic"
            ),
            F.struct(
                n.alias("n"),
                F.concat(F.lit("c-"), (n % 7).cast("string")).alias("customer"),
                F.lit(None).cast("string").alias("note"),
            ).alias("payload"),
            F.create_map(F.lit("tenant"), F.when(n % 2 == 1, "eu").otherwise("us")).alias("meta"),
            (n % 3 * 60).alias("wait"),
        ).repartition(3).write.parquet(path)
        spark.sql(
            "SELECT * FROM VALUES ('order.paid', '{}', TIMESTAMP '2100-01-02 03:04:05.678901'),"
            " ('order.paid', '[]', NULL), ('order.paid', '1', TIMESTAMP '2000-01-01 00:00:00')"
            " AS t(topic, body, not_before)"
        ).coalesce(1).write.parquet(path.replace("events", "timed"))
    finally:
        spark.stop()
    return path


PARQUET_ARGS = (
    "--key-column=topic",
    "--body-column=payload",
    "--headers-column=meta",
    "--delay-column=wait",
    "--id-column=event_id",
)


@pytest.mark.spark
def test_a_parquet_dataset_is_published_once_and_routed(queues, events_parquet, run_pipeline):
    report = run_pipeline("publish", events_parquet, *PARQUET_ARGS, "--progress-seconds=0")
    per_key = Counter(KEYS[n % len(KEYS)] for n in range(ROWS))
    expected_deliveries = sum(count * len(routed(key)) for key, count in per_key.items())
    assert summary(report) == {
        "rows read": ROWS,
        "published": ROWS,
        "skipped as duplicates": 0,
        "deliveries routed": expected_deliveries,
    }
    assert re.search(r"of 100,000 rows published \([\d,]+ rows/s\)", report), report
    assert f"{per_key['user.deleted']:,} messages matched no queue" in report

    # Every message, by its id, with the body, headers, key and delay its row gave it.
    (wrong,) = fetch(
        """
        SELECT count(*) FILTER (WHERE m.id <> (lpad(to_hex(n), 8, '0') || '-0000-4000-8000-'
                                               || lpad(to_hex(n), 12, '0'))::uuid
            OR m.routing_key <> (%s::text[])[n %% 5 + 1]
            OR m.body <> jsonb_build_object('n', n, 'customer', 'c-' || n %% 7, 'note', null)
            OR m.headers <> jsonb_build_object('tenant', CASE n %% 2 WHEN 1 THEN 'eu' ELSE 'us' END)
            OR m.available_at - m.created_at <> make_interval(secs => n %% 3 * 60)),
            count(*), count(DISTINCT (m.body->>'n')::int)
        FROM pgmb_message m, LATERAL (SELECT (m.body->>'n')::int AS n) AS row_n
        """,
        (list(KEYS),),
    )
    assert wrong == (0, ROWS, ROWS)

    # Deliveries: per queue what the routing rules give, one per (message, queue).
    per_queue = dict(
        fetch(
            "SELECT q.name, count(*) FROM pgmb_delivery d JOIN pgmb_queue q ON q.id = d.queue_id"
            " GROUP BY q.name"
        )
    )
    assert per_queue == {
        name: sum(c for key, c in per_key.items() if name in routed(key))
        for name in BINDINGS
        if any(name in routed(key) for key in KEYS)
    }
    assert sum(per_queue.values()) == expected_deliveries
    (doubles,) = fetch(
        "SELECT count(*) FROM (SELECT 1 FROM pgmb_delivery GROUP BY message_id, queue_id"
        " HAVING count(*) > 1) AS d"
    )[0]
    assert doubles == 0
    before = table_counts()

    again = run_pipeline("publish", events_parquet, *PARQUET_ARGS)
    assert summary(again) == {
        "rows read": ROWS,
        "published": 0,
        "skipped as duplicates": ROWS,
        "deliveries routed": 0,
    }
    assert table_counts() == before


@pytest.mark.spark
def test_a_timestamp_column_is_when_to_deliver(queues, events_parquet, run_pipeline):
    timed = events_parquet.replace("events", "timed")
    run_pipeline(
        "publish", timed, "--key-column=topic", "--body-column=body", "--delay-column=not_before"
    )
    rows = fetch(
        "SELECT body::text, available_at = created_at, to_char(available_at AT TIME ZONE 'UTC',"
        " 'YYYY-MM-DD HH24:MI:SS.US') FROM pgmb_message ORDER BY body::text"
    )
    # A time in the past means now, as for pgmb.send.
    assert [row[:2] for row in rows] == [("1", True), ("[]", True), ("{}", False)]
    assert rows[2][2] == "2100-01-02 03:04:05.678901"


def test_skipped_ids_are_not_routed_again(queues):
    """The transition table of INSERT … ON CONFLICT DO NOTHING holds only the rows inserted:
    a message already stored, or twice in a batch, gets no second delivery."""
    stored = pgmb.send("order.paid", {"n": 1})  # orders, all_orders, paid
    new = uuid.uuid4()
    query = lambda name: queries.query("pipeline_publish.sql", name)  # noqa: E731
    with connection.cursor() as cursor:
        cursor.execute(query("create_staging"))
        with cursor.copy(query("copy_staging")) as copy:
            for message_id in (stored, new, new):
                copy.write_row((message_id, "order.paid", '{"n": 2}', "{}", None, None))
        cursor.execute(query("insert_staged"))
        assert cursor.fetchall() == [("order.paid", 1)]
        cursor.execute(query("insert_staged"))  # the same rows again: all stored by now
        assert cursor.fetchall() == []
    per_message = dict(fetch("SELECT message_id, count(*) FROM pgmb_delivery GROUP BY message_id"))
    assert per_message == {stored: 3, new: 3}
    assert fetch("SELECT body::text FROM pgmb_message WHERE id = %s", (stored,)) == [('{"n": 1}',)]


def write_jsonl(path: Path, records: list[dict | str]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


@pytest.mark.spark
def test_json_lines_keep_bodies_as_written(queues, tmp_path, run_pipeline):
    big = "123456789012345678901234567890.5"
    records = [
        {
            "id": event_id(n),
            "topic": "order.paid",
            "body": {"n": n, "note": None, "big": 0},
            "headers": {"tenant": "eu"},
            "delay": "10m",
        }
        for n in range(4)
    ]
    # A number too long for a double, and a body that is an array: byte for byte in jsonb.
    text = json.dumps(records[3]).replace('"big": 0', f'"big": {big}')
    records[2]["body"] = [1, {"a": None}]
    already = pgmb.send("order.paid", {"first": True}, message_id=records[0]["id"])
    path = write_jsonl(tmp_path / "events.jsonl", [*records[:3], text, records[1]])

    report = run_pipeline(
        "publish",
        path,
        "--key-column=topic",
        "--body-column=body",
        "--headers-column=headers",
        "--delay-column=delay",
        "--id-column=id",
    )
    assert summary(report) == {
        "rows read": 5,
        "published": 3,
        "skipped as duplicates": 2,
        "deliveries routed": 9,
    }
    bodies = dict(fetch("SELECT id::text, body::text FROM pgmb_message"))
    assert bodies == {
        event_id(0): '{"first": true}',
        event_id(1): '{"n": 1, "big": 0, "note": null}',
        event_id(2): '[1, {"a": null}]',
        event_id(3): f'{{"n": 3, "big": {big}, "note": null}}',
    }
    delays = fetch(
        "SELECT DISTINCT headers, available_at - created_at FROM pgmb_message WHERE id <> %s",
        (already,),
    )
    assert [(json.loads(h), d.total_seconds()) for h, d in delays] == [({"tenant": "eu"}, 600.0)]
    per_message = fetch("SELECT DISTINCT count(*) FROM pgmb_delivery GROUP BY message_id")
    assert per_message == [(3,)]


def write_csv(path: Path, header: list[str], rows: list[list[str]]) -> str:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


@pytest.mark.spark
def test_csv_with_a_constant_key_and_body_columns(queues, tmp_path, run_pipeline):
    path = write_csv(
        tmp_path / "signups.csv",
        ["name", "note", "plan"],
        [["Ann", 'said "hi",\nthen left', "pro"], ["Bob", "", "free"]],
    )
    report = run_pipeline(
        "publish", path, "--key=order.created", "--body-columns=name,note", "--delay=1h"
    )
    assert summary(report)["published"] == 2
    assert "the ids were generated (no --id-column): running this again publishes" in report
    rows = fetch(
        "SELECT routing_key, body, available_at - created_at FROM pgmb_message ORDER BY body"
    )
    assert [(k, json.loads(b), d.total_seconds()) for k, b, d in rows] == [
        ("order.created", {"name": "Ann", "note": 'said "hi",\nthen left'}, 3600.0),
        ("order.created", {"name": "Bob", "note": None}, 3600.0),
    ]
    assert table_counts() == (2, 4)  # orders and all_orders each


@pytest.mark.spark
def test_csv_with_json_bodies_and_a_body_column(queues, tmp_path, run_pipeline):
    path = write_csv(
        tmp_path / "events.csv",
        ["id", "topic", "body", "headers", "delay"],
        [
            [event_id(n), "invoice.paid", json.dumps({"n": n, "s": 'a"b'}), '{"h": 1}', "30"]
            for n in range(3)
        ],
    )
    report = run_pipeline(
        "publish",
        path,
        "--key-column=topic",
        "--body-column=body",
        "--headers-column=headers",
        "--delay-column=delay",
        "--id-column=id",
    )
    assert summary(report)["published"] == 3
    rows = fetch("SELECT id::text, body, headers FROM pgmb_message ORDER BY id")
    assert [(i, json.loads(b), json.loads(h)) for i, b, h in rows] == [
        (event_id(n), {"n": n, "s": 'a"b'}, {"h": 1}) for n in range(3)
    ]
    assert table_counts() == (3, 3)  # paid


@pytest.mark.spark
def test_a_run_stopped_by_the_database_is_completed_by_a_rerun(queues, tmp_path, run_pipeline):
    """The database refuses a batch half-way: the run stops in one line; once the cause is
    gone, running it again publishes the rest, and nothing twice."""
    records = [{"id": event_id(n), "body": {"n": n, "boom": n == 5}} for n in range(8)]
    path = write_jsonl(tmp_path / "events.jsonl", records)
    args = (
        "publish",
        path,
        "--key=order.paid",
        "--body-column=body",
        "--id-column=id",
        "--batch-size=1",
        "--partitions=1",
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE pgmb_message ADD CONSTRAINT test_no_boom CHECK (body->>'boom' <> 'true')"
            " NOT VALID"
        )
    try:
        with pytest.raises(CommandError) as raised:
            run_pipeline(*args)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pgmb_message DROP CONSTRAINT test_no_boom")
    message = str(raised.value)
    assert "\n" not in message
    assert re.match(
        r"publishing stopped: a partition failed after \d+ of its rows: new row for relation "
        r'"pgmb_message\w*" violates check constraint "test_no_boom" .*; the batches committed '
        r"before stay published: run the same command again to publish the rest \(ids "
        r"already stored are skipped\)$",
        message,
    ), message
    stored, _ = table_counts()
    assert stored < len(records)

    report = run_pipeline(*args)
    assert summary(report)["published"] == len(records) - stored
    assert table_counts() == (len(records), 3 * len(records))
    per_message = fetch("SELECT DISTINCT count(*) FROM pgmb_delivery GROUP BY message_id")
    assert per_message == [(3,)]


@pytest.mark.spark
def test_rows_breaking_a_limit_are_refused_one_by_one_with_their_reasons(
    queues, tmp_path, run_pipeline
):
    """The rows within the limits are published; each of the others is refused, and the
    report says where and why, in pgmb.message_limits' words."""
    deep = json.loads(_nested(66))
    records = [
        {"id": event_id(0), "body": {"n": 0}, "headers": {"tenant": "eu"}},
        {"id": event_id(1), "body": {"n": 1}, "headers": {"Authorization": "Bearer x"}},
        {"id": event_id(2), "body": {"n": 2}},
        {"id": event_id(3), "body": deep},
        {"id": event_id(4), "body": {"n": 4}, "headers": {f"h{n}": n for n in range(65)}},
        {"id": event_id(5), "body": {"n": 5}},
    ]
    path = write_jsonl(tmp_path / "events.jsonl", records)
    record = tmp_path / "refused.jsonl"

    report = run_pipeline(
        "publish",
        path,
        "--key=order.paid",
        "--body-column=body",
        "--headers-column=headers",
        "--id-column=id",
        f"--refused={record}",
    )

    line = next(li for li in report.splitlines() if " rows read, " in li)
    assert line.startswith("publish: 6 rows read, 3 published, 3 refused, 0 skipped"), line
    stored = {i for (i,) in fetch("SELECT id::text FROM pgmb_message")}
    assert stored == {event_id(n) for n in (0, 2, 5)}
    assert table_counts() == (3, 9)
    [warning] = [li for li in report.splitlines() if "break the message limits" in li]
    reasons = [
        "header 'Authorization' is reserved: the broker or the worker sets it",
        "the body: nested deeper than 64 levels (limit max_depth)",
        "65 headers, at most 64 (limit max_headers)",
    ]
    assert warning == (
        f"publish: warning: 3 rows break the message limits and were not published (every "
        f"one in {record}): row 2 of {path} (id {event_id(1)}): {reasons[0]}; row 4 of "
        f"{path} (id {event_id(3)}): {reasons[1]}; row 5 of {path} (id {event_id(4)}): "
        f"{reasons[2]}"
    )
    assert [json.loads(li) for li in record.read_text().splitlines()] == [
        {"file": path, "row": row, "id": event_id(row - 1), "reason": reason}
        for row, reason in zip((2, 4, 5), reasons, strict=True)
    ]


@pytest.mark.spark
def test_publish_on_a_standalone_cluster(spark_cluster, queues, tmp_path, run_pipeline):
    """The partitions run in the cluster's executor (Python workers there, their own
    psycopg connections), not in this process."""
    records = [{"id": event_id(n), "topic": KEYS[n % 5], "body": {"n": n}} for n in range(1000)]
    path = write_jsonl(tmp_path / "events.jsonl", records)
    conf = [arg for pair in spark_cluster.driver_conf for arg in ("--conf", pair)]
    out = io.StringIO()
    call_command(
        "pgmb_pipeline", "publish", path, "--master", spark_cluster.url, *conf,
        "--key-column=topic", "--body-column=body", "--id-column=id", stdout=out,
    )  # fmt: skip
    per_key = Counter(r["topic"] for r in records)
    assert summary(out.getvalue()) == {
        "rows read": 1000,
        "published": 1000,
        "skipped as duplicates": 0,
        "deliveries routed": sum(c * len(routed(k)) for k, c in per_key.items()),
    }
    per_queue = dict(
        fetch(
            "SELECT q.name, count(*) FROM pgmb_delivery d JOIN pgmb_queue q ON q.id = d.queue_id"
            " GROUP BY q.name"
        )
    )
    assert per_queue == {
        name: sum(c for k, c in per_key.items() if name in routed(k))
        for name in BINDINGS
        if any(name in routed(k) for k in KEYS)
    }
    [app] = [a for a in spark_cluster.status()["completedapps"] if a["name"] == "pgmb publish"]
    assert app["state"] == "FINISHED"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


BAD_ROWS = [
    # (what, rows as (topic, body, delay), options, the error's words)
    (
        "bad routing key",
        [("order.paid", '{"n": 0}', "1"), ("order paid", '{"n": 1}', "1")],
        (),
        r"1 of 2 rows of \S+ cannot be published, so none was: row 2 of \S+events.csv "
        r"\(id 00000001-0000-4000-8000-000000000001\): invalid routing key 'order paid': "
        "blanks and control characters are not allowed",
    ),
    (
        "body not JSON",
        [
            ("order.paid", '{"n": 0}', ""),
            ("order.paid", '{"n": 1}', ""),
            ("order.paid", "{oops", ""),
        ],
        (),
        r"row 3 of \S+events.csv \(id \S+\): the body is not valid JSON \(Expecting property name",
    ),
    (
        "wildcard key",
        [("order.*", "{}", "")] * 2,
        (),
        r"2 of 2 rows .*row 1 of .*: invalid routing key 'order\.\*': '\*' and '#' are wildcards",
    ),
    (
        "negative delay",
        [("order.paid", "{}", "-5")],
        (),
        r"row 1 of /\S+events.csv \(id \S+\): invalid delay '-5': a delay must not be negative",
    ),
    (
        "body NaN",
        [("order.paid", '{"x": NaN}', "")],
        (),
        r"the body is not valid JSON \(NaN is not JSON\)",
    ),
    (
        "body with \\u0000",
        [("order.paid", '{"x": "a\\u0000"}', "")],
        (),
        r"the body: \\u0000 cannot be stored in PostgreSQL's jsonb",
    ),
    (
        "missing column",
        [("order.paid", "{}", "")],
        ("--headers-column=meta",),
        r"column 'meta' \(--headers-column\) is not in \S+; its columns: id, topic, body, delay",
    ),
    (
        "bad constant key",
        [("order.paid", "{}", "")],
        ("--key=a b",),
        "--key: invalid routing key 'a b': blanks",
    ),
    (
        "bad constant delay",
        [("order.paid", "{}", "")],
        ("--delay=soon",),
        "--delay: invalid delay 'soon'",
    ),
]


@pytest.mark.spark
@pytest.mark.parametrize("what,rows,options,error", BAD_ROWS, ids=[b[0] for b in BAD_ROWS])
def test_bad_input_is_refused_in_one_line_before_anything_is_written(
    queues, tmp_path, run_pipeline, what, rows, options, error
):
    pgmb.send("order.paid", {"already": "here"})
    before = table_counts()
    path = write_csv(
        tmp_path / "events.csv",
        ["id", "topic", "body", "delay"],
        [[event_id(n), *row] for n, row in enumerate(rows)],
    )
    args = ["--body-column=body", "--delay-column=delay", "--id-column=id"]
    if not any(o.startswith("--key=") for o in options):
        args.append("--key-column=topic")
    if any(o.startswith("--delay=") for o in options):
        args.remove("--delay-column=delay")
    with pytest.raises(CommandError) as raised:
        run_pipeline("publish", path, *args, *options)
    message = str(raised.value)
    assert "\n" not in message
    assert re.search(error, message), message
    assert table_counts() == before


@pytest.mark.spark
@pytest.mark.parametrize(
    "target,error",
    [
        ("missing.parquet", r"cannot read \S+missing.parquet: no such file or directory"),
        ("events.txt", r"cannot tell the format of \S+events.txt from its name: pass --format"),
        ("not-parquet.parquet", r"cannot read \S+not-parquet.parquet as parquet: "),
    ],
)
def test_unreadable_inputs(queues, tmp_path, run_pipeline, target, error):
    (tmp_path / "events.txt").write_text("{}\n")
    (tmp_path / "not-parquet.parquet").write_text("not parquet at all\n")
    with pytest.raises(CommandError) as raised:
        run_pipeline("publish", str(tmp_path / target), "--key=a", "--body-column=b")
    assert "\n" not in str(raised.value)
    assert re.search(error, str(raised.value)), str(raised.value)
    assert table_counts() == (0, 0)


def test_an_unreachable_database_is_one_line_and_nothing_starts(tmp_path):
    path = write_jsonl(tmp_path / "e.jsonl", [{"k": "a", "b": {}}])
    port = closed_port()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pgmb.pipeline",
            "publish",
            path,
            "--key-column=k",
            "--body-column=b",
            "--dsn",
            f"host=127.0.0.1 port={port} dbname=x user=u",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("pgmb.pipeline publish: error: cannot reach the database u@")


# --- The checks themselves, without Spark. ---


@pytest.mark.parametrize(
    "text,reason",
    [
        ('{"a": 1}', None),
        ("[1, 2.5e300, null]", None),
        ('"text"', None),
        ("1" * 5000, None),  # longer than Python's int parsing allows; fine for jsonb
        ('{"a": 1, "a": 2}', None),  # jsonb keeps the last
        ('"\\ud83d\\ude00"', None),  # a surrogate pair: one character
        ("", "not valid JSON"),
        ('{"a": 1} x', "not valid JSON (Extra data"),
        ("NaN", "not valid JSON (NaN is not JSON)"),
        ('{"a": -Infinity}', "not valid JSON (-Infinity is not JSON)"),
        ('"a\\u0000"', "\\u0000 cannot be stored"),
        ('{"\\u0000": 1}', "\\u0000 cannot be stored"),
        ('["\\ud800"]', "unpaired UTF-16 surrogate"),
        ('"tab\there"', "not valid JSON (Invalid control character"),
    ],
)
def test_json_is_held_to_what_jsonb_accepts(text, reason, db):
    found = json_problem(text)
    assert (found is None) == (reason is None), found
    if reason:
        assert reason in found
    assert jsonb_accepts(text) == (reason is None)


def jsonb_accepts(text: str) -> bool:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT %s::jsonb", (text,))
    except DatabaseError:
        return False
    return True


def _nested(depth: int) -> str:
    return "[" * (depth - 1) + "1" + "]" * (depth - 1)


#: (body, headers) as the dataset holds them: within the limits, or each limit broken.
LIMITS = [
    ("{}", None),
    (_nested(64), "{}"),
    (_nested(65), None),
    (_nested(3000), None),  # deeper than Python's parser goes
    ('{"a": ' * 10 + "1" + "}" * 10, '{"x-trace": "a"}'),
    ("1", json.dumps({f"h{n}": n for n in range(64)})),
    ("1", json.dumps({f"h{n}": n for n in range(65)})),
    ("1", json.dumps({"deep": json.loads(_nested(64))})),
    ("1", json.dumps({"AUTHORIZATION": "Bearer x"})),
    ("1", json.dumps({"Webhook-Id": "x"})),
    ("1", json.dumps({"x": "é" * 4095})),  # 8191 bytes with its name
    ("1", json.dumps({"x": "é" * 4096})),
    ("1", json.dumps({f"h{n}": "v" * 8000 for n in range(5)})),
    ("1", json.dumps({"n": [1.5, 10**20, None, True]})),
]


@pytest.mark.parametrize("body,headers", LIMITS)
def test_a_rows_limits_are_the_databases(body, headers, db):
    """A well-formed row breaks a message limit in the pipeline exactly when
    pgmb.message_problem says it does, in the same words."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pgmb.message_problem(%s::jsonb, coalesce(%s::jsonb, '{}'))", (body, headers)
        )
        [(in_sql,)] = cursor.fetchall()
    assert limits_problem(body, headers) == in_sql


def test_headers_must_be_an_object():
    assert json_problem("[1]", want_object=True) == "not a JSON object but list"
    assert json_problem('{"a": [1]}', want_object=True) is None


def test_a_row_is_held_to_pgmbs_rules():
    plan = Plan(dsn="", batch_size=1, has_id=True)
    ok = dict(zip(CHECKED, (event_id(1), "order.paid", "{}", None, None, 0, None), strict=True))

    def check(**change: object) -> str | None:
        return problem(tuple({**ok, **change}.values()), plan)

    assert check() is None
    assert check(id=None) == "it has no message id"
    assert check(id="nope") == "message id 'nope' is not a UUID"
    assert check(key="a b").startswith("invalid routing key 'a b': blanks")
    assert check(body=None) == "it has no body (null)"
    assert check(headers='"x"') == "the headers are not a JSON object but str"
    assert check(delay=1e400) == "invalid delay inf: it must be a finite number of seconds"
    assert check(delay="2026-01-01T00:00:00").startswith(
        "invalid delay '2026-01-01T00:00:00': the time has no time zone"
    )
    assert check(corrupt='{"a": ') == "not a JSON object: '{\"a\": '"


@pytest.mark.parametrize(
    "path,fmt",
    [
        ("e.parquet", "parquet"),
        ("dir/e.parquet/", "parquet"),
        ("e.jsonl.gz", "jsonl"),
        ("s3a://b/e.ndjson", "jsonl"),
        ("E.CSV", "csv"),
        ("e.json", "jsonl"),
    ],
)
def test_the_format_comes_from_the_name(path, fmt):
    assert input_format(path, None) == fmt
    assert input_format(path, "csv") == "csv"


def test_an_unknown_extension_needs_format():
    with pytest.raises(PipelineError, match=re.escape("pass --format parquet|jsonl|csv")):
        input_format("events", None)


def test_the_executors_code_needs_no_django():
    code = (
        "import sys, pgmb.pipeline.publish, pgmb.pipeline.publish_rows;"
        "print([m for m in sys.modules if m.split('.')[0] in ('django', 'pyspark')])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert done.stdout.strip() == "[]"
