"""The message option rules (pgmb/options.py), one table of cases through Python
(``check_options``, what pgmb.send checks) and SQL (``pgmb.check_message_options``, what
the SQL pgmb.send checks, and the CHECK on pgmb_message for plain INSERTs)."""

from __future__ import annotations

import math
import uuid

import psycopg
import pytest
from django.db import connection, transaction

from pgmb.errors import InvalidOption
from pgmb.options import check_options

pytestmark = pytest.mark.django_db

ME = uuid.UUID("01a206ed-0000-7000-8000-000000000001")
OTHER = uuid.UUID("01a206ed-0000-7000-8000-000000000002")

# (options, accepted?)
CASES: list[tuple[dict, bool]] = [
    ({}, True),
    ({"priority": -32768}, True),
    ({"priority": 32767}, True),
    ({"priority": 32768}, False),
    ({"priority": -32769}, False),
    ({"group": "g"}, True),
    ({"group": "x" * 128}, True),
    ({"group": "é" * 128}, True),  # characters, not bytes
    ({"group": "x" * 129}, False),
    ({"group": ""}, False),
    ({"group": "a b"}, False),
    ({"group": "a\tb"}, False),
    ({"group": "a\u00a0b"}, False),
    ({"group": "order:42/eu"}, True),
    ({"dedup_id": "d-1"}, True),
    ({"dedup_id": "x" * 128}, True),
    ({"dedup_id": "x" * 129}, False),
    ({"dedup_id": ""}, False),
    ({"dedup_id": "a\nb"}, False),
    ({"max_retries": 0}, True),
    ({"max_retries": 1_000_000}, True),
    ({"max_retries": 1_000_001}, False),
    ({"max_retries": -1}, False),
    ({"retry_delay": 0.0}, True),
    ({"retry_delay": 1.5}, True),
    ({"retry_delay": 2592000.0}, True),
    ({"retry_delay": 2592000.5}, False),
    ({"retry_delay": -0.1}, False),
    ({"retry_delay": math.nan}, False),
    ({"retry_delay": math.inf}, False),
    ({"depends_on": [OTHER]}, True),
    ({"depends_on": [OTHER] * 100}, True),
    ({"depends_on": [OTHER] * 101}, False),
    ({"depends_on": []}, False),
    ({"depends_on": [ME]}, False),
    ({"depends_on": [OTHER, ME]}, False),
]


def _python(options: dict) -> bool:
    try:
        check_options(ME, **options)
    except InvalidOption:
        return False
    return True


def _sql(options: dict) -> bool:
    params = {
        "priority": options.get("priority", 0),
        "group_key": options.get("group"),
        "depends_on": options.get("depends_on"),
        "dedup_id": options.get("dedup_id"),
        "max_retries": options.get("max_retries"),
        "retry_delay": options.get("retry_delay"),
    }
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT pgmb.check_message_options(%(id)s, %(priority)s, %(group_key)s, "
                "%(depends_on)s::uuid[], %(dedup_id)s, %(max_retries)s, %(retry_delay)s::float8)",
                {"id": ME, **params},
            )
    except Exception as exc:
        cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
        assert isinstance(cause, psycopg.Error) and cause.sqlstate == "22023", exc
        return False
    return True


@pytest.mark.parametrize(("options", "accepted"), CASES, ids=[repr(c[0])[:60] for c in CASES])
def test_python_and_sql_give_the_same_verdict(options, accepted):
    assert _python(options) is accepted
    assert _sql(options) is accepted


def test_python_refuses_wrong_types():
    for options in (
        {"priority": True},
        {"priority": 1.0},
        {"group": 7},
        {"max_retries": "3"},
        {"retry_delay": "3"},
        {"depends_on": ["not a uuid"]},
    ):
        with pytest.raises(InvalidOption):
            check_options(ME, **options)


def test_a_plain_insert_is_held_to_the_same_rules(sql, raises_sql):
    with raises_sql("23514", "pgmb_message_options_valid"):
        sql(
            "INSERT INTO pgmb_message (id, routing_key, body, available_at, group_key) "
            "VALUES (gen_random_uuid(), 'k', '1', now(), 'a b')"
        )


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("group_key", "'a b'"),
        ("depends_on", "'{}'::uuid[]"),
        ("dedup_id", "''"),
        ("max_retries", "-1"),
        ("retry_delay", "'NaN'::float8"),
    ],
)
def test_each_option_alone_reaches_the_rules(sql, raises_sql, column, value):
    """The admit trigger's WHEN lists every option column (0026): none slips past alone."""
    with raises_sql("23514", "pgmb_message_options_valid"):
        sql(
            f"INSERT INTO pgmb_message (id, routing_key, body, available_at, {column}) "
            f"VALUES (gen_random_uuid(), 'k', '1', now(), {value})"
        )
    assert sql("SELECT count(*) FROM pgmb_message") == [(0,)]
