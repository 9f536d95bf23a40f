"""A worker's answers that stop retries: one table of cases, one verdict (and one stored form)
from the model's validation (the admin's form) and from the database (pgmb.check_final_answers,
whatever writes the row); and the abort header's constants, named once in Python, in the
PL/Python transport and in SQL."""

from __future__ import annotations

import itertools

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.utils import DatabaseError

from pgmb import final_answers
from pgmb.models import Worker
from pgmb.sql import plpython_transport

pytestmark = pytest.mark.django_db

_names = itertools.count(1)

# (dead_statuses, retried_statuses, stored form of both, or None: refused)
CASES: list[tuple[object, object, tuple[list[str], list[str]] | None]] = [
    ([], [], ([], [])),
    (["410"], [], (["410"], [])),
    (["404", "410", "400", "422"], [], (["400", "404", "410", "422"], [])),
    (["4XX"], ["429", "408"], (["4xx"], ["408", "429"])),
    ([" 410\t", "410", "5xx"], [], (["410", "5xx"], [])),
    (["1xx", "3xx", "100", "599"], [], (["100", "1xx", "3xx", "599"], [])),
    ([], ["503"], ([], ["503"])),
    # Not a status, or not a failure's.
    (["6xx"], [], None),
    (["abc"], [], None),
    (["99"], [], None),
    (["600"], [], None),
    (["0410"], [], None),
    (["2xx"], [], None),
    (["200"], [], None),
    (["4x"], [], None),
    (["41x"], [], None),
    ([""], [], None),
    (["410\n"], [], None),
    (["٤١٠"], [], None),  # Arabic-Indic digits: not ASCII
    (["410", "abc"], [], None),
    # The retried list takes statuses only, and none that dead_statuses names.
    (["4xx"], ["4xx"], None),
    (["4xx"], ["429x"], None),
    (["410"], ["410"], None),
    (["410"], [" 410"], None),
]


def _python(dead: object, retried: object) -> tuple[list[str], list[str]] | None:
    worker = Worker(
        name=f"rule_{next(_names)}",
        endpoint="http://127.0.0.1:9/",
        dead_statuses=dead,
        retried_statuses=retried,
    )
    try:
        worker.full_clean()
    except ValidationError as exc:
        assert set(exc.message_dict) <= {"dead_statuses", "retried_statuses"}, exc.message_dict
        return None
    return worker.dead_statuses, worker.retried_statuses


def _sql(dead: object, retried: object) -> tuple[list[str], list[str]] | None:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO pgmb_worker (id, name, endpoint, dead_statuses, retried_statuses)"
                " VALUES (gen_random_uuid(), %s, 'http://127.0.0.1:9/', %s::text[], %s::text[])"
                " RETURNING dead_statuses, retried_statuses",
                [f"rule_{next(_names)}", dead, retried],
            )
            stored = cursor.fetchone()
    except DatabaseError as exc:
        assert getattr(exc.__cause__, "sqlstate", None) == "22023", exc
        assert "_statuses for worker" in str(exc), exc
        return None
    return list(stored[0]), list(stored[1])


@pytest.mark.parametrize(("dead", "retried", "stored"), CASES, ids=[repr(c[:2]) for c in CASES])
def test_one_verdict_in_python_and_sql(dead, retried, stored):
    assert _python(dead, retried) == stored
    assert _sql(dead, retried) == stored


def test_sql_names_what_is_wrong_and_changes_nothing():
    worker = Worker.objects.create(
        name="rule_update", endpoint="http://127.0.0.1:9/", dead_statuses=["410"]
    )
    for dead, message in [
        (["6xx"], "invalid dead_statuses for worker rule_update: '6xx' is not an HTTP status"),
        (["410", "abc"], "'abc' is not an HTTP status"),
        (["99"], "'99' is not"),
        (["600"], "'600' is not"),
    ]:
        with pytest.raises(DatabaseError, match=message), transaction.atomic():
            Worker.objects.filter(pk=worker.pk).update(dead_statuses=dead)
    with pytest.raises(DatabaseError, match="429 is in dead_statuses too"), transaction.atomic():
        Worker.objects.filter(pk=worker.pk).update(
            dead_statuses=["4xx", "429"], retried_statuses=["429"]
        )
    assert Worker.objects.get(pk=worker.pk).dead_statuses == ["410"]


def test_a_null_list_is_refused_in_both():
    assert final_answers.statuses_problem(None, classes=True) is not None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgmb.statuses_problem(NULL, true)")
        assert cursor.fetchone()[0] == final_answers.statuses_problem(None, classes=True)


def test_problems_read_the_same_in_python_and_sql():
    with connection.cursor() as cursor:
        for entries, classes in [
            (["4xx", "6xx"], True),
            (["4xx"], False),
            ([None], True),
            (["o'4\\xx"], True),
            ([], True),
        ]:
            cursor.execute("SELECT pgmb.statuses_problem(%s::text[], %s)", [entries, classes])
            assert cursor.fetchone()[0] == final_answers.statuses_problem(entries, classes=classes)


def test_the_abort_constants_are_named_once():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgmb.abort_header(), pgmb.abort_value(), pgmb.aborted_prefix()")
        header, value, prefix = cursor.fetchone()
    assert header == final_answers.ABORT_HEADER.lower()
    assert value == final_answers.ABORT_VALUE
    assert prefix == final_answers.ABORTED
    # The PL/Python transport cannot import pgmb: its copies are checked here.
    assert plpython_transport.ABORT_HEADER == final_answers.ABORT_HEADER
    assert plpython_transport.ABORT_VALUE == final_answers.ABORT_VALUE
    assert plpython_transport.ABORTED == final_answers.ABORTED


@pytest.mark.parametrize(
    ("status", "error", "dead", "retried", "final"),
    [
        (410, "HTTP 410: gone", ["410"], [], True),
        (410, "HTTP 410: gone", [], [], False),
        (404, "HTTP 404", ["4xx"], ["408", "429"], True),
        (429, "HTTP 429", ["4xx"], ["408", "429"], False),
        (500, "HTTP 500", ["4xx"], [], False),
        (None, "timeout after 1s", ["4xx", "5xx"], [], False),
        (409, final_answers.ABORTED + "HTTP 409", [], [], True),
        (None, final_answers.ABORTED + "forged by no one", [], [], False),
        (409, "HTTP 409: " + final_answers.ABORTED, [], [], False),
    ],
)
def test_which_answers_are_final(status, error, dead, retried, final):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pgmb.final_answer_note(%s, %s, %s::text[], %s::text[])",
            [status, error, dead, retried],
        )
        assert (cursor.fetchone()[0] is not None) is final
