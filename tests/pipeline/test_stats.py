"""The ``stats`` job: hourly figures of a known history, checked against numbers worked
out by hand; re-runs; the archive's attempts counted once; bad input refused."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest
from django.core.management import CommandError
from django.db import connection

from pgmb.errors import PipelineError
from pgmb.models import Attempt, HourlyStatistics, Queue
from pgmb.pipeline.spark import session
from pgmb.pipeline.stats import check_paths, parse_since, window_start

from .conftest import MASTER

UTC = datetime.timezone.utc
T0 = datetime.datetime(2024, 5, 1, 10, tzinfo=UTC)
H0, H1, H2 = T0, T0 + datetime.timedelta(hours=1), T0 + datetime.timedelta(hours=2)
NONE = "(unknown)"


def at(hour: int, minute: int = 0, second: int = 0, ms: int = 0) -> datetime.datetime:
    return T0 + datetime.timedelta(hours=hour, minutes=minute, seconds=second, milliseconds=ms)


class History:
    """Messages and attempts written straight into the tables, at chosen times."""

    def __init__(self) -> None:
        self.attempts: list[Attempt] = []

    def message(
        self, published: datetime.datetime, message_id: uuid.UUID | None = None
    ) -> uuid.UUID:
        message_id = message_id or uuid.uuid4()
        with connection.cursor() as cursor:
            # The routing key matches no queue: no deliveries, only history.
            cursor.execute(
                "INSERT INTO pgmb_message (id, routing_key, body, headers, created_at,"
                " available_at) VALUES (%s, 'stats.test', '{}', '{}', %s, %s)",
                [message_id, published, published],
            )
        return message_id

    def attempt(self, message, queue, n, outcome, when, status=None, id=None) -> None:
        self.attempts.append(
            Attempt(
                id=id,
                message_id=message,
                queue_id=queue.id,
                attempt=n,
                outcome=outcome,
                status_code=status if status is not None else (200 if outcome == "ack" else None),
                created_at=when,
            )
        )

    def save(self) -> None:
        Attempt.objects.bulk_create(self.attempts)


def table() -> dict[tuple, dict]:
    """pgmb_statistics by (hour, queue, worker)."""
    return {
        (r["hour"], r["queue_name"], r["worker_name"]): r
        for r in HourlyStatistics.objects.values(
            "hour",
            "queue_name",
            "worker_name",
            "attempts",
            "delivered",
            "failed",
            "retried",
            "dead_lettered",
            "expired",
            "attempts_per_message",
            "latency_p50_ms",
            "latency_p95_ms",
            "latency_p99_ms",
            "top_errors",
        )
    }


def row(attempts, delivered, retried, dead, expired, apm, p50, p95, p99, top) -> dict:
    return {
        "attempts": attempts,
        "delivered": delivered,
        "failed": attempts - delivered,
        "retried": retried,
        "dead_lettered": dead,
        "expired": expired,
        "attempts_per_message": None if apm is None else float(apm),
        "latency_p50_ms": p50,
        "latency_p95_ms": p95,
        "latency_p99_ms": p99,
        "top_errors": [{"status": s, "count": c} for s, c in top],
    }


def assert_table(expected: dict[tuple, dict]) -> None:
    got = table()
    assert sorted(got) == sorted(expected)
    for key, want in expected.items():
        have = {k: v for k, v in got[key].items() if k not in ("hour", "queue_name", "worker_name")}
        assert have == want, (key, have, want)


@pytest.fixture
def known_history(make_worker, make_queue):
    """Three hours, three queues, two workers (alpha: orders; beta: mail and sms)."""
    alpha, beta = make_worker("alpha"), make_worker("beta")
    orders = make_queue("never.orders", "orders", alpha)
    mail = make_queue("never.mail", "mail", beta)
    sms = make_queue("never.sms", "sms", beta)
    h = History()
    # orders, 10:00: latencies 100, 400 (after a 503), 250; one message dead after 3 tries.
    m = h.message(at(0))
    h.attempt(m, orders, 1, "ack", at(0, ms=100))
    m = h.message(at(0))
    h.attempt(m, orders, 1, "retry", at(0, ms=50), 503)
    h.attempt(m, orders, 2, "ack", at(0, ms=400))
    m = h.message(at(0))
    # A lease that ran out before its request started ('unsent'): no worker was asked, so
    # it is in no figure below.
    h.attempt(m, orders, 0, "unsent", at(0, ms=200))
    h.attempt(m, orders, 1, "ack", at(0, ms=250))
    m = h.message(at(0))
    h.attempt(m, orders, 1, "retry", at(0, ms=10), 503)
    h.attempt(m, orders, 2, "retry", at(0, ms=20), 500)
    h.attempt(m, orders, 3, "dead", at(0, ms=30), 503)
    # orders, 11:00: published the hour before, acked in this one (2 s); a lease that ran
    # out, then an ack 20 minutes after publishing.
    m = h.message(at(0, 59, 59))
    h.attempt(m, orders, 1, "ack", at(1, 0, 1))
    m = h.message(at(1))
    h.attempt(m, orders, 1, "expired", at(1, 10))
    h.attempt(m, orders, 2, "ack", at(1, 20))
    # orders, 12:00: only a dead letter (no acks: no latency, no attempts per message).
    m = h.message(at(2))
    h.attempt(m, orders, 1, "dead", at(2, 5), 410)
    # mail, 10:00: ten acks at 10..100 ms; eight failures: 502 thrice, 503 and 429 twice, 500.
    for k in range(1, 11):
        m = h.message(at(0))
        h.attempt(m, mail, 1, "ack", at(0, ms=10 * k))
    for status in (502, 502, 502, 503, 503, 429, 429, 500):
        m = h.message(at(0))
        h.attempt(m, mail, 1, "retry", at(0, 0, 1), status)
    # mail, 12:00: a hundred acks at 1..100 ms.
    for k in range(1, 101):
        m = h.message(at(2))
        h.attempt(m, mail, 1, "ack", at(2, ms=k))
    # sms, 10:00: one ack after 1 s.
    m = h.message(at(0))
    h.attempt(m, sms, 1, "ack", at(0, 0, 1))
    # sms, 11:00: an ack at 300 ms; one at 3 s after no answer and a 504.
    m = h.message(at(1))
    h.attempt(m, sms, 1, "ack", at(1, ms=300))
    m = h.message(at(1))
    h.attempt(m, sms, 1, "retry", at(1, 0, 1))
    h.attempt(m, sms, 2, "retry", at(1, 0, 2), 504)
    h.attempt(m, sms, 3, "ack", at(1, 0, 3))
    h.save()
    return {"alpha": alpha, "beta": beta, "orders": orders, "mail": mail, "sms": sms}


# Worked out by hand. percentile_approx on so few values is exact and picks the value of
# rank ceil(p·n): p50 of 10..100 (n=10) is the 5th (50), p95 and p99 the 10th (100).
ORDERS = {
    H0: row(7, 3, 3, 1, 0, Fraction(4, 3), 250.0, 400.0, 400.0, [(503, 3), (500, 1)]),
    H1: row(3, 2, 0, 0, 1, 1.5, 2000.0, 1200000.0, 1200000.0, [(None, 1)]),
    H2: row(1, 0, 0, 1, 0, None, None, None, None, [(410, 1)]),
}
MAIL = {
    H0: row(18, 10, 8, 0, 0, 1, 50.0, 100.0, 100.0, [(502, 3), (429, 2), (503, 2)]),
    H2: row(100, 100, 0, 0, 0, 1, 50.0, 95.0, 99.0, []),
}
SMS = {
    H0: row(1, 1, 0, 0, 0, 1, 1000.0, 1000.0, 1000.0, []),
    H1: row(4, 2, 2, 0, 0, 2, 300.0, 3000.0, 3000.0, [(504, 1), (None, 1)]),
}
# beta at 10:00: mail's and sms' attempts; latencies 10..100 and 1000 (n=11): p50 is the
# 6th (60), p95 and p99 the 11th.
BETA = {
    H0: row(19, 11, 8, 0, 0, 1, 60.0, 1000.0, 1000.0, [(502, 3), (429, 2), (503, 2)]),
    H1: SMS[H1],
    H2: MAIL[H2],
}
# Every queue. 10:00: 14 latencies 10..100, 100, 250, 400, 1000: p50 the 7th (70), p95
# (rank 13.3 → 14) and p99 the largest; attempts per message (4 + 10 + 1) / 14.
# 11:00: 300, 2000, 3000, 1200000: p50 the 2nd, p95 and p99 the 4th. 12:00: 1..100.
TOTAL = {
    H0: row(
        26, 14, 11, 1, 0, Fraction(15, 14), 70.0, 1000.0, 1000.0, [(503, 5), (502, 3), (429, 2)]
    ),
    H1: row(7, 4, 2, 0, 1, 1.75, 2000.0, 1200000.0, 1200000.0, [(None, 2), (504, 1)]),
    H2: row(101, 100, 0, 1, 0, 1, 50.0, 95.0, 99.0, [(410, 1)]),
}


def expected() -> dict[tuple, dict]:
    rows = {}
    for hour, figures in ORDERS.items():
        rows[(hour, "orders", "alpha")] = figures
        rows[(hour, "", "alpha")] = figures
    for hour, figures in MAIL.items():
        rows[(hour, "mail", "beta")] = figures
    for hour, figures in SMS.items():
        rows[(hour, "sms", "beta")] = figures
    for hour, figures in BETA.items():
        rows[(hour, "", "beta")] = figures
    for hour, figures in TOTAL.items():
        rows[(hour, "", "")] = figures
    return rows


@pytest.mark.spark
def test_every_figure_of_a_known_history_and_reruns(known_history, run_pipeline):
    report = run_pipeline("stats", "--partitions", "3")
    assert "stats: 135 attempts in PostgreSQL of the whole history (JDBC partitions: 3)" in report
    assert "stats: 16 rows over 3 hours" in report
    assert "stats: pgmb_statistics: 16 new, 0 changed, 0 unchanged, 0 removed" in report
    assert_table(expected())
    first = table()
    # From the middle of 11:00: the window starts at 11:00, and 11:00 and 12:00 are
    # recomputed whole, to the same figures.
    report = run_pipeline("stats", "--since", "2024-05-01T11:30:00Z")
    assert (
        "stats: 108 attempts in PostgreSQL since 2024-05-01 11:00 UTC (JDBC partitions: 4)"
        in report
    )
    assert "stats: pgmb_statistics: 0 new, 0 changed, 10 unchanged, 0 removed" in report
    assert table() == first
    # sms moves to alpha: its 11:00 is counted under alpha now, and beta's rows of that
    # hour go (recomputed hours are replaced whole).
    Queue.objects.filter(name="sms").update(worker=known_history["alpha"])
    report = run_pipeline("stats", "--since", "2024-05-01T11:00:00+00:00")
    assert "stats: pgmb_statistics: 1 new, 1 changed, 7 unchanged, 2 removed" in report
    want = expected()
    del want[(H1, "sms", "beta")], want[(H1, "", "beta")]
    want[(H1, "sms", "alpha")] = SMS[H1]
    want[(H1, "", "alpha")] = TOTAL[H1]
    assert_table(want)


@pytest.mark.spark
def test_no_attempts_in_the_window_writes_nothing(known_history, run_pipeline):
    # The history is of 2024: the last two hours have nothing.
    report = run_pipeline("stats", "--hours", "2")
    assert "stats: 0 attempts in PostgreSQL since" in report
    assert "nothing to write" in report
    assert table() == {}


# The archive, as the archive job is assumed to lay it out: Parquet datasets
# attempts/day=…/queue=… and messages/day=…, with the tables' columns.

ORDERS_ID = uuid.UUID("00000000-0000-0000-0000-00000000a001")
GONE_ID = uuid.UUID("00000000-0000-0000-0000-00000000dead")
D1, A1, A2, O1, O2, E1 = (uuid.UUID(int=n) for n in range(1, 7))
NINE = datetime.datetime(2024, 5, 1, 9, tzinfo=UTC)


def nine(minute: int = 0, second: int = 0, ms: int = 0) -> datetime.datetime:
    return NINE + datetime.timedelta(minutes=minute, seconds=second, milliseconds=ms)


ARCHIVED_ATTEMPTS = [
    # id, message, queue id, queue (partition), attempt, outcome, status, time
    # Also still in PostgreSQL (an archive run that crashed before its delete).
    (1, D1, ORDERS_ID, "orders", 1, "ack", 200, nine(ms=100)),
    (900001, A1, ORDERS_ID, "orders", 1, "ack", 200, nine(ms=500)),
    (900002, A2, ORDERS_ID, "orders", 1, "retry", 503, nine(0, 1)),
    (900003, A2, ORDERS_ID, "orders", 2, "ack", 200, nine(0, 2)),
    # A queue deleted since: named by its partition, its worker unknown; O2's message is
    # missing from the archive (no latency).
    (900004, O1, GONE_ID, "old_queue", 1, "ack", 200, nine(30)),
    (900005, O2, GONE_ID, "old_queue", 1, "ack", 200, nine(31)),
    # Before --since: left out.
    (800001, E1, ORDERS_ID, "orders", 1, "ack", 200, NINE - datetime.timedelta(hours=10)),
]
ARCHIVED_MESSAGES = [(D1, nine()), (A1, nine()), (A2, nine()), (O1, nine(29, 59)), (E1, nine())]


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> Iterator[dict[str, Path]]:
    """A good archive, and one whose attempts lack a column, written by Spark."""
    root = tmp_path_factory.mktemp("archives")
    spark = session("test archive", MASTER, {}, None)
    try:
        attempts = spark.createDataFrame(
            [
                (
                    i,
                    str(m),
                    str(q),
                    n,
                    outcome,
                    status,
                    12.5,
                    "",
                    when,
                    when.date().isoformat(),
                    queue,
                )
                for i, m, q, queue, n, outcome, status, when in ARCHIVED_ATTEMPTS
            ],
            "id long, message_id string, queue_id string, attempt int, outcome string, "
            "status_code int, duration_ms double, error string, created_at timestamp, "
            "day string, queue string",
        )
        messages = spark.createDataFrame(
            [
                (str(m), "stats.test", "{}", "{}", when, when, when.date().isoformat())
                for m, when in ARCHIVED_MESSAGES
            ],
            "id string, routing_key string, body string, headers string, "
            "created_at timestamp, available_at timestamp, day string",
        )
        good, bad = root / "good", root / "bad"
        attempts.write.partitionBy("day", "queue").parquet(str(good / "attempts"))
        messages.write.partitionBy("day").parquet(str(good / "messages"))
        attempts.drop("outcome").write.parquet(str(bad / "attempts"))
        messages.write.parquet(str(bad / "messages"))
    finally:
        spark.stop()
    empty = root / "empty"
    (empty / "attempts").mkdir(parents=True)
    (empty / "messages").mkdir()
    yield {"good": good, "bad": bad, "empty": empty}


@pytest.mark.spark
def test_the_archive_counts_too_and_an_attempt_in_both_once(
    archives, make_worker, make_queue, run_pipeline, tmp_path
):
    alpha = make_worker("alpha")
    orders = Queue.objects.create(id=ORDERS_ID, name="orders", binding_key="never.x", worker=alpha)
    h = History()
    h.message(nine(), D1)
    h.attempt(D1, orders, 1, "ack", nine(ms=100), id=1)
    h.save()
    output = tmp_path / "stats.parquet"
    report = run_pipeline(
        "stats",
        "--since",
        "2024-05-01",
        "--include-archive",
        str(archives["good"]),
        "--output",
        str(output),
    )
    assert (
        "stats: 1 attempts in PostgreSQL since 2024-05-01 00:00 UTC (JDBC partitions: 1)" in report
    )
    assert f"stats: and the archive's at {archives['good']}" in report
    assert f"stats: wrote 5 rows to {output}" in report
    # orders: attempt 1 once; latencies 100, 500, 2000. old_queue: 1000 (O2 has none).
    # All: latencies 100, 500, 1000, 2000; attempts per message (1 + 1 + 2 + 1 + 1) / 5.
    orders_row = row(4, 3, 1, 0, 0, Fraction(4, 3), 500.0, 2000.0, 2000.0, [(503, 1)])
    gone_row = row(2, 2, 0, 0, 0, 1, 1000.0, 1000.0, 1000.0, [])
    want = {
        (NINE, "orders", "alpha"): orders_row,
        (NINE, "", "alpha"): orders_row,
        (NINE, "old_queue", NONE): gone_row,
        (NINE, "", NONE): gone_row,
        (NINE, "", ""): row(6, 5, 1, 0, 0, 1.2, 500.0, 2000.0, 2000.0, [(503, 1)]),
    }
    assert_table(want)
    # The Parquet output holds the same rows.
    spark = session("test output", MASTER, {}, None)
    try:
        written = {
            (
                r.hour.replace(tzinfo=UTC) if r.hour.tzinfo is None else r.hour,
                r.queue_name,
                r.worker_name,
            ): (
                r.attempts,
                r.delivered,
                r.latency_p50_ms,
                json.loads(r.top_errors),
            )
            for r in spark.read.parquet(str(output)).collect()
        }
    finally:
        spark.stop()
    assert written == {
        key: (w["attempts"], w["delivered"], w["latency_p50_ms"], w["top_errors"])
        for key, w in want.items()
    }


# Bad input: one line, and the table as it was.


def test_since_and_window():
    now = datetime.datetime(2024, 5, 1, 10, 42, 7, tzinfo=UTC)
    assert window_start(None, None, now) is None
    assert window_start("2024-05-01", None, now) == datetime.datetime(2024, 5, 1, tzinfo=UTC)
    assert window_start("2024-05-01T08:59:59.9", None, now) == datetime.datetime(
        2024, 5, 1, 8, tzinfo=UTC
    )
    # An offset is honoured: 10:30+02:00 is 08:30 UTC.
    assert window_start("2024-05-01T10:30+02:00", None, now) == datetime.datetime(
        2024, 5, 1, 8, tzinfo=UTC
    )
    assert parse_since("2024-05-01T10:30Z") == datetime.datetime(2024, 5, 1, 10, 30, tzinfo=UTC)
    # The last 3 hours and the current one.
    assert window_start(None, 3, now) == datetime.datetime(2024, 5, 1, 7, tzinfo=UTC)
    with pytest.raises(PipelineError, match="exclude each other"):
        window_start("2024-05-01", 3, now)
    for bad in ("yesterday", "2024-13-01", "", "1714557600"):
        with pytest.raises(PipelineError, match="not an ISO date or time"):
            parse_since(bad)


def test_the_job_needs_neither_django_nor_pyspark_to_load():
    # Executors of a cluster have neither Django nor the project; pyspark only once a
    # session starts.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pgmb.pipeline.cli, pgmb.pipeline.stats; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'django', 'pyspark'}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"


def test_archive_and_output_paths(tmp_path):
    with pytest.raises(PipelineError, match=f"no folder {tmp_path / 'nope'}"):
        check_paths(str(tmp_path / "nope"), None)
    (tmp_path / "a" / "attempts").mkdir(parents=True)
    with pytest.raises(PipelineError, match=f"no folder {tmp_path / 'a' / 'messages'}"):
        check_paths(str(tmp_path / "a"), None)
    (tmp_path / "a" / "messages").mkdir()
    check_paths(str(tmp_path / "a"), str(tmp_path / "out"))
    check_paths(f"file://{tmp_path / 'a'}", None)
    check_paths("s3a://bucket/archive", "s3a://bucket/archive/stats")  # Spark's to check
    with pytest.raises(PipelineError, match="is inside the archive"):
        check_paths(str(tmp_path / "a"), str(tmp_path / "a" / "stats"))


@pytest.mark.spark
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "last tuesday"], "--since 'last tuesday': not an ISO date or time"),
        (["--since", "2024-05-01", "--hours", "2"], "--since and --hours exclude each other"),
        (["--include-archive", "{tmp}/nope"], "--include-archive {tmp}/nope: no folder"),
        (["--include-archive", "{empty}"], "cannot read the archive's attempts at {empty}"),
        (
            ["--include-archive", "{bad}"],
            "the archive's attempts at {bad}/attempts have no column outcome",
        ),
        (
            ["--include-archive", "{good}", "--output", "{good}/stats"],
            "--output {good}/stats is inside the archive {good}",
        ),
    ],
    ids=[
        "since",
        "since-and-hours",
        "no-archive",
        "empty-archive",
        "no-column",
        "output-in-archive",
    ],
)
def test_bad_input_is_one_line_and_leaves_the_table_alone(
    known_history, archives, run_pipeline, tmp_path, args, message
):
    HourlyStatistics.objects.create(
        hour=H0,
        queue_name="orders",
        worker_name="alpha",
        attempts=1,
        delivered=1,
        failed=0,
        retried=0,
        dead_lettered=0,
        expired=0,
        top_errors=[],
    )
    before = table()
    paths = {"tmp": tmp_path, **archives}
    with pytest.raises(CommandError) as info:
        run_pipeline("stats", *(a.format(**paths) for a in args))
    assert message.format(**paths) in str(info.value)
    assert "\n" not in str(info.value)
    assert table() == before
