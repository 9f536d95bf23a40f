"""The time rule (pgmb.durations.check_time, pgmb.valid_time in SQL): one table of cases
through both, then every write path of a message's or a delivery's times.

Issue 26: ``pgmb.send(…, 'infinity'::timestamptz)`` was stored; the message never went out
and the admin's message and delivery lists answered 500 for every user (no ``datetime``
holds infinity or the year 294276)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction

import pgmb
from pgmb.durations import check_time, parse_delay
from pgmb.errors import InvalidDelay
from pgmb.models import Delivery, Message, Queue

pytestmark = pytest.mark.django_db(transaction=True)

#: (a time as ISO-8601 / PostgreSQL text, whether pgmb stores it). Python reads the text
#: with parse_delay (what pgmb_send, JSON Lines and the pipeline use); SQL casts it.
CASES = [
    ("2026-12-01T10:00:00+00:00", True),
    ("2026-12-01T10:00:00Z", True),
    ("0001-01-01T00:00:00+00:00", True),
    ("9999-12-31T23:59:59.999999+00:00", True),
    ("9999-12-31T23:59:59+05:00", True),
    # In UTC these are the year 10000 and the year 0.
    ("9999-12-31T23:00:00-05:00", False),
    ("0001-01-01T00:30:00+01:00", False),
    ("10000-01-01T00:00:00+00:00", False),
    ("294276-12-31T23:59:59+00:00", False),
    ("infinity", False),
    ("-infinity", False),
]


def _python(text: str) -> bool:
    try:
        parsed = parse_delay(text)
    except InvalidDelay:
        return False
    assert isinstance(parsed, datetime)
    assert check_time(parsed) is parsed
    return True


def _sql(text: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgmb.valid_time(%s::timestamptz)", [text])
        (valid,) = cursor.fetchone()
    if not valid:
        with (
            pytest.raises(Exception, match="invalid delay") as refused,
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute("SELECT pgmb.check_time(%s::timestamptz)", [text])
        assert refused.value.__cause__.sqlstate == "22023"
    return bool(valid)


@pytest.mark.parametrize(("text", "stored"), CASES, ids=[c[0] for c in CASES])
def test_python_and_sql_give_the_same_verdict(text, stored):
    assert _python(text) is stored
    assert _sql(text) is stored


# ---- every write path --------------------------------------------------------------

#: Aware datetimes Python can hold whose UTC time is outside the rule.
OUTSIDE = [
    datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),
    datetime(1, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))),
]


@pytest.fixture
def queues(make_queue):
    """A queue with a worker and a pull queue, both bound to every key."""
    make_queue("#")
    Queue.objects.create(name="pulled", binding_key="#", worker=None)


def _refused(conn: psycopg.Connection, statement: str, params, sqlstate: str, constraint=None):
    with pytest.raises(psycopg.Error) as refused:
        conn.execute(statement, params)
    assert refused.value.sqlstate == sqlstate, refused.value
    assert refused.value.diag.constraint_name == constraint
    return str(refused.value)


@pytest.mark.parametrize("moment", OUTSIDE, ids=["year-10000-utc", "year-0-utc"])
def test_python_send_and_send_batch_refuse_before_the_database(queues, moment):
    with pytest.raises(InvalidDelay, match="from the year 1 to the year 9999"):
        pgmb.send("k", 1, delay=moment)
    with pytest.raises(InvalidDelay, match="from the year 1 to the year 9999"):
        pgmb.send_batch([("k", 1), pgmb.Outgoing("k", 2, delay=moment)])
    assert Message.objects.count() == 0


@pytest.mark.parametrize(
    "text", ["infinity", "-infinity", "294276-12-31 23:59:59+00", "10000-01-01 00:00+00"]
)
def test_sql_send_refuses_as_a_producer(queues, login_role, text):
    _, producer = login_role("pgmb_producer")
    for call in (
        "SELECT pgmb.send(gen_random_uuid(), 'k', '1', '{}', %s::timestamptz)",
        "SELECT pgmb.send(gen_random_uuid(), 'k', '1', '{}', %s::timestamptz, priority => 1,"
        " dedup_id => 'd')",
    ):
        message = _refused(producer, call, [text], "22023")
        assert "invalid delay" in message and "year 9999" in message
    assert Message.objects.count() == 0 and Delivery.objects.count() == 0


@pytest.mark.parametrize("moment", OUTSIDE, ids=["year-10000-utc", "year-0-utc"])
def test_the_orm_is_refused_by_the_database(queues, moment):
    with pytest.raises(IntegrityError, match="pgmb_message_times_valid"), transaction.atomic():
        Message.objects.create(routing_key="k", body=1, available_at=moment)
    assert Message.objects.count() == 0


@pytest.mark.parametrize("column", ["available_at", "created_at"])
@pytest.mark.parametrize("text", ["infinity", "-infinity", "294276-12-31 23:59:59+00"])
def test_a_plain_insert_and_copy_are_refused(queues, owner, column, text):
    other = "created_at" if column == "available_at" else "available_at"
    _refused(
        owner,
        f"INSERT INTO pgmb_message (id, routing_key, body, {column}, {other}) "
        "VALUES (gen_random_uuid(), 'k', '1', %s::timestamptz, now())",
        [text],
        "23514",
        "pgmb_message_times_valid",
    )
    copy_in = f"COPY pgmb_message (id, routing_key, body, {column}, {other}) FROM STDIN"
    with (
        pytest.raises(psycopg.errors.CheckViolation, match=f"{column} "),
        owner.cursor() as cursor,
        owner.transaction(),
        cursor.copy(copy_in) as copy,
    ):
        copy.write_row((uuid.uuid4(), "k", "1", "now", "now"))
        copy.write_row((uuid.uuid4(), "k", "1", text, "now"))
    assert Message.objects.count() == 0 and Delivery.objects.count() == 0


@pytest.mark.parametrize("text", ["infinity", "-infinity", "294276-12-31 23:59:59+00"])
def test_an_update_of_a_stored_time_is_refused(queues, owner, text):
    mid = pgmb.send("k", {"n": 1}, delay=60)
    before = Message.objects.get(id=mid).available_at
    for column in ("available_at", "created_at"):
        _refused(
            owner,
            f"UPDATE pgmb_message SET {column} = %s::timestamptz WHERE id = %s",
            [text, mid],
            "23514",
            "pgmb_message_times_valid",
        )
        _refused(
            owner,
            f"UPDATE pgmb_delivery SET {column} = %s::timestamptz WHERE message_id = %s",
            [text, mid],
            "23514",
            "pgmb_delivery_times_valid",
        )
    assert Message.objects.get(id=mid).available_at == before
    assert {d.available_at for d in Delivery.objects.filter(message_id=mid)} == {before}


def test_times_inside_the_rule_are_published_to_both_queues(queues, login_role):
    _, producer = login_role("pgmb_producer")
    far = "9999-12-31 23:59:59+00"
    (mid,) = producer.execute(
        "SELECT pgmb.send(gen_random_uuid(), 'k', %s::jsonb, '{}', %s::timestamptz)",
        [json.dumps(1), far],
    ).fetchone()
    assert Delivery.objects.filter(message_id=mid).count() == 2
    assert Message.objects.get(id=mid).available_at == datetime(
        9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc
    )
