"""One layout, two generators: message ids made in Python (pgmb.ids.uuid7) and in SQL
(pgmb.uuid_v7(), the column's default) are version 7 UUIDs carrying the time they were
made, so both sort in time order with the same checks."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from django.db import connection

import pgmb
from pgmb.ids import milliseconds, uuid7
from pgmb.models import Message

pytestmark = pytest.mark.django_db


def sql_uuid7() -> uuid.UUID:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgmb.uuid_v7()")
        return cursor.fetchone()[0]


GENERATORS: dict[str, Callable[[], uuid.UUID]] = {"python": uuid7, "sql": sql_uuid7}


@pytest.fixture(params=sorted(GENERATORS))
def generate(request) -> Callable[[], uuid.UUID]:
    return GENERATORS[request.param]


def test_version_variant_and_time(generate):
    before = time.time_ns() // 1_000_000
    ids = [generate() for _ in range(50)]
    after = time.time_ns() // 1_000_000
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert all(before <= milliseconds(i) <= after for i in ids)
    assert len(set(ids)) == len(ids)


def test_ids_of_later_milliseconds_sort_after(generate):
    first = generate()
    # Wait on the clock itself (not a sleep): the next id must be made in a later millisecond.
    while time.time_ns() // 1_000_000 <= milliseconds(first):
        pass
    assert generate() > first
    assert str(generate()) > str(first)  # as text too: what the admin and logs sort by


def test_python_and_sql_ids_share_one_order():
    ids = []
    for make in (uuid7, sql_uuid7, uuid7, sql_uuid7):
        ids.append(make())
        stamp = milliseconds(ids[-1])
        while time.time_ns() // 1_000_000 <= stamp:
            pass
    assert ids == sorted(ids)


def test_published_messages_get_time_ordered_ids():
    sent = pgmb.send("k", 1)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgmb_message (routing_key, body) VALUES ('k', '2') RETURNING id"
        )
        [default] = cursor.fetchone()
    assert sent.version == 7 and default.version == 7
    assert Message().id.version == 7  # the model's default too
    assert milliseconds(sent) <= milliseconds(default)


def test_ids_given_by_callers_still_work():
    mine = uuid.uuid4()
    assert pgmb.send("k", 1, message_id=mine) == mine
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgmb.send(%s, 'k', '1'::jsonb)", [uuid.uuid4()])
        assert cursor.fetchone()[0].version == 4
