"""The circuit breaker's settings: one table of cases, one verdict from the model's
validation (the admin's form) and from the database (pgmb.check_breaker, whatever
writes the row)."""

from __future__ import annotations

import itertools
import math

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.utils import DatabaseError

from pgmb.models import Worker

pytestmark = pytest.mark.django_db

_names = itertools.count(1)

CASES: list[tuple[dict[str, object], bool]] = [
    ({}, True),  # off: the defaults
    ({"breaker_failures": None}, True),
    ({"breaker_failures": 0}, True),  # off too
    ({"breaker_failures": 1}, True),
    ({"breaker_failures": 1_000_000}, True),
    ({"breaker_failures": 1_000_001}, False),
    ({"breaker_failures": -1}, False),
    ({"breaker_rate": 0.5}, True),
    ({"breaker_rate": 1.0}, True),
    ({"breaker_rate": 1e-9}, True),
    ({"breaker_rate": 0.0}, False),
    ({"breaker_rate": -0.5}, False),
    ({"breaker_rate": 1.01}, False),
    ({"breaker_rate": math.nan}, False),
    ({"breaker_rate": math.inf}, False),
    ({"breaker_window": 0.5}, True),
    ({"breaker_window": 86400.0}, True),
    ({"breaker_window": 86400.5}, False),
    ({"breaker_window": 0.0}, False),
    ({"breaker_window": math.nan}, False),
    ({"breaker_min_requests": 1}, True),
    ({"breaker_min_requests": 0}, False),
    ({"breaker_min_requests": 1_000_001}, False),
    ({"breaker_cooldown": 0.05}, True),
    ({"breaker_cooldown": 0.0}, False),
    ({"breaker_cooldown": -1.0}, False),
    ({"breaker_cooldown": math.inf}, False),
    ({"breaker_cooldown": 600.0, "breaker_cooldown_max": 600.0}, True),
    ({"breaker_cooldown": 100.0, "breaker_cooldown_max": 50.0}, False),
    ({"breaker_cooldown_max": 86400.0}, True),
    ({"breaker_cooldown_max": 86401.0}, False),
    ({"breaker_cooldown_max": math.nan}, False),
]


def _python_accepts(fields: dict[str, object]) -> bool:
    worker = Worker(name=f"rule_{next(_names)}", endpoint="http://127.0.0.1:9/", **fields)
    try:
        worker.full_clean()
    except ValidationError as exc:
        assert set(exc.message_dict) <= set(fields), exc.message_dict
        return False
    return True


def _sql_accepts(fields: dict[str, object]) -> bool:
    try:
        with transaction.atomic():
            Worker.objects.create(
                name=f"rule_{next(_names)}", endpoint="http://127.0.0.1:9/", **fields
            )
    except DatabaseError as exc:
        cause = exc.__cause__
        assert getattr(cause, "sqlstate", None) in {"22023", "23514"}, exc
        return False
    return True


@pytest.mark.parametrize(("fields", "valid"), CASES, ids=[str(c[0]) for c in CASES])
def test_one_verdict_in_python_and_sql(fields, valid):
    assert _python_accepts(fields) is valid
    assert _sql_accepts(fields) is valid


def test_an_update_is_checked_too():
    worker = Worker.objects.create(name="rule_update", endpoint="http://127.0.0.1:9/")
    with pytest.raises(DatabaseError, match="invalid breaker_rate"), transaction.atomic():
        Worker.objects.filter(pk=worker.pk).update(breaker_rate=2)
    assert Worker.objects.get(pk=worker.pk).breaker_rate is None
