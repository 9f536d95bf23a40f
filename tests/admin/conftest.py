"""Helpers of the admin tests: pages are fetched with Django's test client, logged in as a
superuser, against the real test database."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

# The end-to-end tests of the admin's actions run a dispatcher too.
from tests.dispatch.conftest import dispatch  # noqa: F401


def url(name: str, *args: Any) -> str:
    return reverse(f"admin:pgmb_{name}", args=args)


def form_errors(response) -> dict[str, list[str]]:
    """The field errors of the admin form a response re-displayed ({} if it was accepted)."""
    if response.status_code == 302:
        return {}
    assert response.status_code == 200, response.status_code
    form = response.context["adminform"].form
    return {field: list(messages) for field, messages in form.errors.items()}


def table_rows(response) -> list[str]:
    """The result rows of a changelist page, as HTML snippets."""
    html = response.content.decode()
    table = html.split('id="result_list"', 1)[1].split("</table>", 1)[0]
    return re.findall(r"<tr[^>]*>(.*?)</tr>", table.split("<tbody>", 1)[1], re.S)


@pytest.fixture
def count_queries():
    """Run a callable and return how many queries it took."""

    def run(fn) -> int:
        with CaptureQueriesContext(connection) as captured:
            fn()
        return len(captured)

    return run


#: The tables whose statistics tests change (fresh_statistics).
STATISTICS_TABLES = ("pgmb_message", "pgmb_attempt", "pgmb_delivery", "pgmb_dead_letter")


@pytest.fixture
def fresh_statistics(django_db_blocker):
    """Planner statistics reset after the test's rollback.

    ANALYZE updates pg_class in place: its reltuples would outlive the rollback of the
    test's rows and make later tests' lists look big; and the tables and their indexes
    keep the rolled-back rows' pages until vacuumed and reindexed. Set up before the test's
    transaction (list it first), so its teardown runs after the rollback, in autocommit.
    """
    yield
    with django_db_blocker.unblock():
        assert not connection.in_atomic_block
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM ANALYZE {', '.join(STATISTICS_TABLES)}")
            # The indexes keep the pages of the rolled-back rows; their size would change
            # later tests' plans (tests/metrics/test_plans.py).
            for table in STATISTICS_TABLES:
                cursor.execute(f"REINDEX TABLE {table}")
