"""The rule of a unique key and its on_duplicate (pgmb.options.check_unique_key,
pgmb.unique_key_problem in SQL): one table of cases through Python and SQL, each through its
publishing calls too (pgmb.send and pgmb.send_batch in Python, pgmb.send_unique and a plain
INSERT in SQL), which must store nothing they refuse."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from django.db import connection, transaction

import pgmb
from pgmb.errors import InvalidOption
from pgmb.models import Message
from pgmb.options import MAX_UNIQUE_KEY_LENGTH, check_unique_key

pytestmark = pytest.mark.django_db

# (unique_key, on_duplicate, accepted?)
CASES: list[tuple[str | None, str | None, bool]] = [
    ("order-42", "skip", True),
    ("order-42", "replace", True),
    ("order-42", None, True),  # NULL is 'skip'
    ("x" * MAX_UNIQUE_KEY_LENGTH, "skip", True),
    ("ключ/ü", "replace", True),
    (None, "skip", True),  # the default, without a key: nothing to decide
    (None, None, True),
    ("", "skip", False),
    ("x" * (MAX_UNIQUE_KEY_LENGTH + 1), "skip", False),
    ("two words", "skip", False),
    ("tab\there", "skip", False),
    ("nbsp\u00a0", "skip", False),
    ("order-42", "SKIP", False),
    ("order-42", "debounce", False),
    ("order-42", "", False),
    (None, "replace", False),  # replace what?
    (None, "later", False),
]


def _python(key, mode) -> bool:
    try:
        check_unique_key(key, mode)
    except InvalidOption:
        return False
    return True


def _sql(key, mode) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgmb.unique_key_problem(%s, %s)", (key, mode))
        return cursor.fetchone()[0] is None


def _python_sends(key, mode) -> int:
    """How many of send and send_batch accepted (each stores one message)."""
    accepted = 0
    for call in (
        lambda: pgmb.send("rules.unique", {}, unique_key=key, on_duplicate=mode),
        lambda: pgmb.send_batch(
            [{"routing_key": "rules.unique", "body": {}, "unique_key": key, "on_duplicate": mode}]
        ),
    ):
        try:
            with transaction.atomic():
                call()
            accepted += 1
        except InvalidOption:
            pass
    return accepted


def _sql_sends(key, mode) -> int:
    """How many of pgmb.send_unique (with a key) and a plain INSERT accepted."""
    accepted = 0
    statements = [
        (
            "INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at,"
            " unique_key, on_duplicate)"
            " VALUES (%s, 'rules.unique', '{}', '{}', now(), now(), %s, %s)",
            (uuid.uuid4(), key, mode),
        )
    ]
    if key is not None:
        statements.append(
            (
                "SELECT pgmb.send_unique(%s, 'rules.unique', '{}'::jsonb, %s, %s)",
                (uuid.uuid4(), key, mode),
            )
        )
    for statement, params in statements:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(statement, params)
            accepted += 1
        except Exception as exc:
            cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
            # The function says 22023; the table's trigger, a CHECK violation naming its rule;
            # a plain INSERT of a text longer than its column, the column's own 22001.
            assert isinstance(cause, psycopg.Error), exc
            assert cause.sqlstate in ("22023", "23514", "22001"), exc
            if cause.sqlstate == "23514":
                assert cause.diag.constraint_name == "pgmb_message_unique_key_valid"
    return accepted


@pytest.mark.parametrize(("key", "mode", "accepted"), CASES)
def test_python_and_sql_give_the_same_verdict(key, mode, accepted):
    assert _python(key, mode) is accepted
    assert _sql(key, mode) is accepted


@pytest.mark.parametrize(("key", "mode", "accepted"), CASES)
def test_publishing_stores_only_what_the_rule_accepts(key, mode, accepted):
    # No queue matches rules.unique: each accepted message is stored (nothing to skip).
    sql_calls = 2 if key is not None else 1
    assert _python_sends(key, mode) == (2 if accepted else 0)
    assert _sql_sends(key, mode) == (sql_calls if accepted else 0)
    assert Message.objects.count() == ((2 + sql_calls) if accepted else 0)


def test_python_refuses_what_is_not_text():
    for key, mode in ((42, "skip"), (b"k", "skip"), ("k", 1), ("k", True)):
        with pytest.raises(InvalidOption):
            check_unique_key(key, mode)  # type: ignore[arg-type]


def test_sql_send_unique_needs_a_key():
    with pytest.raises(Exception) as info, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pgmb.send_unique(gen_random_uuid(), 'rules.unique', '{}', NULL)")
    assert "a unique key is required" in str(info.value)
    assert not Message.objects.exists()
