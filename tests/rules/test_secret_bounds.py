"""The bounds on a worker's secrets are one number each in Python (pgmb.worker_secrets) and
SQL: the retiring secrets that sign (``pgmb.max_retiring_secrets()``) and a new secret's
least key length (``pgmb.new_secret_problem``, whose cases are test_shared_rules.SECRETS)."""

from __future__ import annotations

import pytest
from django.db import connection

from pgmb.worker_secrets import MAX_RETIRING_SECRETS, MIN_SECRET_BYTES, new_secret_problem

pytestmark = pytest.mark.django_db


def one(statement: str, params: tuple = ()) -> object:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone()[0]


def test_the_retiring_bound_is_one_number():
    assert one("SELECT pgmb.max_retiring_secrets()") == MAX_RETIRING_SECRETS


@pytest.mark.parametrize("length", [MIN_SECRET_BYTES - 1, MIN_SECRET_BYTES])
def test_the_least_length_is_one_number_with_one_sentence(length):
    raw = "k" * length
    assert one("SELECT pgmb.new_secret_problem(%s)", (raw,)) == new_secret_problem(raw)
    assert (new_secret_problem(raw) is None) is (length >= MIN_SECRET_BYTES)
