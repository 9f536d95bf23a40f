"""The rule of a message's expiry (pgmb.options.check_expiry, pgmb.expiry_problem in SQL):
one table of cases through Python and SQL, each through its publishing call too (pgmb.send
in Python, the pgmb.send overload with ttl in SQL), which must store nothing it refuses."""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from django.db import connection, transaction

import pgmb
from pgmb.errors import InvalidOption
from pgmb.models import Message
from pgmb.options import check_expiry

pytestmark = pytest.mark.django_db

PAST = datetime(2020, 1, 1, tzinfo=timezone.utc)
LATER = datetime(2099, 1, 1, tzinfo=timezone.utc)
LAST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc)

# (ttl, expires_at, accepted?)
CASES: list[tuple[float | None, datetime | None, bool]] = [
    (None, None, True),
    (1, None, True),
    (0.001, None, True),
    (1e9, None, True),  # about 31 years
    (0, None, False),
    (-1, None, False),
    (-0.5, None, False),
    (math.nan, None, False),
    (math.inf, None, False),
    (-math.inf, None, False),
    (1e12, None, False),  # past the year 9999
    (None, PAST, True),  # already past: expires at once
    (None, LATER, True),
    (None, LAST, True),
    (1, LATER, False),  # both
    (0.5, PAST, False),
]


def _python(ttl, expires_at) -> bool:
    try:
        check_expiry(ttl, expires_at)
    except InvalidOption:
        return False
    return True


def _refused_22023(exc: Exception) -> None:
    cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    assert isinstance(cause, psycopg.Error) and cause.sqlstate == "22023", exc


def _sql(ttl, expires_at) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgmb.expiry_problem(%s::float8, %s::timestamptz)", (ttl, expires_at))
        problem = cursor.fetchone()[0]
    return problem is None


def _python_send(ttl, expires_at) -> bool:
    try:
        with transaction.atomic():
            pgmb.send("rules.expiry", {}, ttl=ttl, expires_at=expires_at)
    except InvalidOption:
        return False
    return True


def _sql_send(ttl, expires_at) -> bool:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT pgmb.send(%s, 'rules.expiry', '{}'::jsonb, NULL, NULL,"
                " ttl => %s::float8, expires_at => %s::timestamptz)",
                (uuid.uuid4(), ttl, expires_at),
            )
    except Exception as exc:
        _refused_22023(exc)
        return False
    return True


@pytest.mark.parametrize(("ttl", "expires_at", "accepted"), CASES)
def test_python_and_sql_give_the_same_verdict(ttl, expires_at, accepted):
    assert _python(ttl, expires_at) is accepted
    assert _sql(ttl, expires_at) is accepted


@pytest.mark.parametrize(("ttl", "expires_at", "accepted"), CASES)
def test_publishing_stores_only_what_the_rule_accepts(ttl, expires_at, accepted):
    before = Message.objects.count()
    assert _python_send(ttl, expires_at) is accepted
    assert _sql_send(ttl, expires_at) is accepted
    assert Message.objects.count() == before + (2 if accepted else 0)


def test_the_stored_expiry():
    """A ttl counts from publication; an expires_at is kept as given."""
    a = pgmb.send("rules.expiry", {}, ttl=timedelta(minutes=5))
    b = pgmb.send("rules.expiry", {}, expires_at=LATER)
    c = pgmb.send("rules.expiry", {})
    rows = dict(Message.objects.filter(id__in=[a, b, c]).values_list("id", "expires_at"))
    made = Message.objects.get(id=a).created_at
    assert rows[a] == made + timedelta(minutes=5)
    assert rows[b] == LATER
    assert rows[c] is None


def test_python_refuses_what_is_not_a_time_or_a_number():
    for ttl, expires_at in (
        ("5", None),
        (True, None),
        (None, "2030-01-01T00:00:00Z"),
        (None, 1893456000),
        (None, datetime(2030, 1, 1)),  # naive
    ):
        with pytest.raises(InvalidOption):
            check_expiry(ttl, expires_at)
    with pytest.raises(InvalidOption, match="not both"):
        pgmb.send("rules.expiry", {}, ttl=5, expires_at=LATER)
    with pytest.raises(InvalidOption):
        pgmb.send_batch([{"routing_key": "rules.expiry", "body": {}, "ttl": -1}])
    assert not Message.objects.exists()


@pytest.mark.parametrize("text", ["infinity", "-infinity", "10000-01-01 00:00:00+00"])
def test_sql_refuses_times_pgmb_does_not_store(text):
    with pytest.raises(Exception) as info, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pgmb.send(gen_random_uuid(), 'rules.expiry', '{}'::jsonb, NULL, NULL,"
            " ttl => NULL, expires_at => %s::timestamptz)",
            (text,),
        )
    _refused_22023(info.value)
    assert "invalid expires_at" in str(info.value)
    assert not Message.objects.exists()


@pytest.mark.parametrize("text", ["infinity", "10000-01-01 00:00:00+00", "0001-01-01 00:00:00+01"])
def test_a_plain_insert_or_update_is_held_to_the_time_rule(sql, raises_sql, text):
    """Issue 26's lesson: no writer stores an expiry no Python client could read."""
    with raises_sql("23514", "pgmb_message_times_valid"):
        sql(
            "INSERT INTO pgmb_message (routing_key, body, expires_at) VALUES ('k', '1', %s)",
            (text,),
        )
    assert not Message.objects.exists()
    sql("INSERT INTO pgmb_message (routing_key, body, expires_at) VALUES ('k', '1', now())")
    with raises_sql("23514", "expires_at"):
        sql("UPDATE pgmb_message SET expires_at = %s", (text,))
    [(stored,)] = sql("SELECT expires_at IS NOT NULL AND expires_at <= now() FROM pgmb_message")
    assert stored
