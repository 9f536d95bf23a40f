"""The cron rule (pgmb/schedules.py's cronsim, pgmb.cron_next in SQL): one table of cases
through both (docs/decisions/0089-schedules-fired-by-the-loops.md), then a sweep of
generated expressions and start times compared between them. DST edges in Europe/Berlin
(2026-03-29 02:00 → 03:00, 2026-10-25 03:00 → 02:00) and America/New_York, the day-of-month
OR day-of-week rule, Feb 29, and bad input refused with the same words."""

from __future__ import annotations

import datetime
import random

import pytest
from django.db import connection, transaction
from django.db.utils import DatabaseError

from pgmb.errors import InvalidSchedule
from pgmb.schedules import cron_next

pytestmark = pytest.mark.django_db

UTC = datetime.timezone.utc

# (expression, time zone, after (UTC), the next due time (UTC) or "! " and the error).
CASES: list[tuple[str, str, str | None, str]] = [
    ("*/15 * * * *", "UTC", "2026-01-01T00:07:30", "2026-01-01T00:15:00"),
    ("0 * * * *", "UTC", "2026-01-01T00:59:59.5", "2026-01-01T01:00:00"),
    ("5,10-12 3 * * *", "UTC", "2026-01-01T03:11:00", "2026-01-01T03:12:00"),
    ("0 0 29 2 *", "UTC", "2026-03-01T00:00:00", "2028-02-29T00:00:00"),
    ("0 12 1 * MON", "UTC", "2026-06-02T00:00:00", "2026-06-08T12:00:00"),
    ("0 12 13 * 5", "UTC", "2026-02-14T00:00:00", "2026-02-20T12:00:00"),
    ("0 12 * * 0", "UTC", "2026-06-02T00:00:00", "2026-06-07T12:00:00"),
    ("0 12 * * 7", "UTC", "2026-06-02T00:00:00", "2026-06-07T12:00:00"),
    ("0 12 */2 * MON", "UTC", "2026-06-02T00:00:00", "2026-06-15T12:00:00"),
    ("0 9 * JAN-MAR,DEC MON-FRI", "UTC", "2026-04-01T00:00:00", "2026-12-01T09:00:00"),
    ("30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00", "2026-03-29T01:00:00"),
    ("30 2 * * *", "Europe/Berlin", "2026-03-29T01:00:00", "2026-03-30T00:30:00"),
    ("0 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00", "2026-03-29T01:00:00"),
    ("30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00", "2026-10-25T00:30:00"),
    ("30 2 * * *", "Europe/Berlin", "2026-10-25T00:30:00", "2026-10-26T01:30:00"),
    ("*/30 * * * *", "Europe/Berlin", "2026-10-25T00:10:00", "2026-10-25T00:30:00"),
    ("*/30 * * * *", "Europe/Berlin", "2026-10-25T00:40:00", "2026-10-25T01:00:00"),
    ("*/30 * * * *", "Europe/Berlin", "2026-10-25T01:10:00", "2026-10-25T01:30:00"),
    ("0 * * * *", "Europe/Berlin", "2026-03-29T00:30:00", "2026-03-29T01:00:00"),
    ("30 * * * *", "Europe/Berlin", "2026-03-29T00:45:00", "2026-03-29T01:30:00"),
    ("0 3 * * *", "Europe/Berlin", "2026-03-29T00:30:00", "2026-03-29T01:00:00"),
    ("15 2,3 * * *", "Europe/Berlin", "2026-10-25T00:20:00", "2026-10-25T02:15:00"),
    ("0 0 * * *", "Europe/Berlin", "2026-12-31T23:00:00", "2027-01-01T23:00:00"),
    ("0 9 * * 1-5", "America/New_York", "2026-03-06T15:00:00", "2026-03-09T13:00:00"),
    ("0 2 * * *", "America/New_York", "2026-03-07T12:00:00", "2026-03-08T07:00:00"),
    ("1/20 5-7/2 * * *", "UTC", "2026-01-01T00:00:00", "2026-01-01T05:01:00"),
    ("0 0 1 */5 *", "UTC", "2026-02-01T00:00:00", "2026-06-01T00:00:00"),
    ("  0   0 1 1 *  ", "UTC", "2026-02-01T00:00:00", "2027-01-01T00:00:00"),
    ("0 0 31 * *", "UTC", "2026-02-01T00:00:00", "2026-03-31T00:00:00"),
    ("59 23 31 12 *", "UTC", "2026-12-31T23:59:00", "2027-12-31T23:59:00"),
    (
        "0 0 * * * *",
        "UTC",
        None,
        '! bad cron expression "0 0 * * * *": expected 5 fields '
        "(minute hour day-of-month month day-of-week), got 6",
    ),
    (
        "* * * *",
        "UTC",
        None,
        '! bad cron expression "* * * *": expected 5 fields '
        "(minute hour day-of-month month day-of-week), got 4",
    ),
    (
        "",
        "UTC",
        None,
        '! bad cron expression "": expected 5 fields '
        "(minute hour day-of-month month day-of-week), got 0",
    ),
    ("61 * * * *", "UTC", None, '! bad cron expression "61 * * * *": bad minute'),
    ("* 24 * * *", "UTC", None, '! bad cron expression "* 24 * * *": bad hour'),
    ("* * 0 * *", "UTC", None, '! bad cron expression "* * 0 * *": bad day-of-month'),
    ("* * * 13 *", "UTC", None, '! bad cron expression "* * * 13 *": bad month'),
    ("* * * * 8", "UTC", None, '! bad cron expression "* * * * 8": bad day-of-week'),
    ("*/0 * * * *", "UTC", None, '! bad cron expression "*/0 * * * *": bad minute'),
    ("5-1 * * * *", "UTC", None, '! bad cron expression "5-1 * * * *": bad minute'),
    ("a * * * *", "UTC", None, '! bad cron expression "a * * * *": bad minute'),
    ("0 0 L * *", "UTC", None, '! bad cron expression "0 0 L * *": L, W and # are not supported'),
    ("0 0 * * 5L", "UTC", None, '! bad cron expression "0 0 * * 5L": L, W and # are not supported'),
    (
        "0 0 * * MON#2",
        "UTC",
        None,
        '! bad cron expression "0 0 * * MON#2": L, W and # are not supported',
    ),
    (
        "0 0 15W * *",
        "UTC",
        None,
        '! bad cron expression "0 0 15W * *": L, W and # are not supported',
    ),
    ("0 0 30 2 *", "UTC", None, '! bad cron expression "0 0 30 2 *": bad day-of-month'),
    ("0 0 * * *", "Mars/Olympus", None, '! unknown time zone "Mars/Olympus"'),
    ("0 0 * * *", "UTC+3", None, '! unknown time zone "UTC+3"'),
    ("-1 * * * *", "UTC", None, '! bad cron expression "-1 * * * *": bad minute'),
    ("1,,2 * * * *", "UTC", None, '! bad cron expression "1,,2 * * * *": bad minute'),
]


def _utc(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=UTC)


def _python(expr: str, tz: str, after: datetime.datetime) -> str:
    try:
        return cron_next(expr, tz, after).isoformat()
    except InvalidSchedule as exc:
        return f"! {exc}"


def _sql(expr: str, tz: str, after: datetime.datetime) -> str:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pgmb.cron_next(%s, %s, %s)", [expr, tz, after])
            return cursor.fetchone()[0].astimezone(UTC).isoformat()
    except DatabaseError as exc:
        return f"! {exc.__cause__.diag.message_primary}"


@pytest.mark.parametrize(("expr", "tz", "after", "expected"), CASES)
def test_one_table_through_both(expr, tz, after, expected):
    start = _utc(after or "2026-01-01T00:00:00")
    want = expected if expected.startswith("!") else _utc(expected).isoformat()
    assert _python(expr, tz, start) == want
    assert _sql(expr, tz, start) == want


def _field(rng: random.Random, lo: int, hi: int, names: list[str] | None) -> str:
    def one() -> str:
        v = rng.randint(lo, hi)
        return names[v - lo] if names and rng.random() < 0.3 else str(v)

    kind = rng.choice(["*", "n", "range", "step", "list", "rangestep", "*step"])
    if kind == "*":
        return "*"
    if kind == "n":
        return one()
    a, b = sorted(rng.randint(lo, hi) for _ in range(2))
    if kind == "range":
        return f"{a}-{b}"
    if kind == "step":
        return f"{a}/{rng.randint(1, 9)}"
    if kind == "rangestep":
        return f"{a}-{b}/{rng.randint(1, 5)}"
    if kind == "*step":
        return f"*/{rng.randint(1, 12)}"
    return ",".join(one() for _ in range(rng.randint(2, 4)))


MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]


def test_generated_expressions_agree():
    """Expressions made of every supported form, in three zones, from start times around
    the DST changes and the year's end: Python and SQL give the same due time or the same
    refusal."""
    rng = random.Random(89)
    starts = [
        _utc(t)
        for t in (
            "2026-03-28T23:59:30",
            "2026-03-29T00:59:00",
            "2026-10-25T00:29:59",
            "2026-10-25T01:45:00",
            "2026-12-31T22:58:00",
            "2028-02-28T10:00:00",
        )
    ]
    compared = 0
    for _ in range(120):
        expr = " ".join(
            [
                _field(rng, 0, 59, None),
                _field(rng, 0, 23, None),
                _field(rng, 1, 31, None),
                _field(rng, 1, 12, MONTHS),
                _field(rng, 0, 7, [*DAYS, "SUN"]),
            ]
        )
        tz = rng.choice(["UTC", "Europe/Berlin", "America/New_York"])
        for start in rng.sample(starts, 2):
            assert _sql(expr, tz, start) == _python(expr, tz, start), (expr, tz, start)
            compared += 1
    assert compared == 240
