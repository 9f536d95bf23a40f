"""A paginator that asks the planner how many rows there are, instead of counting them.

Django's changelist counts its rows exactly (``COUNT(*)``) for the paginator: on a table of
millions of messages or attempts that is a scan of the whole table on every page view.
:class:`EstimatedCountPaginator` takes the planner's estimate instead (see
docs/decisions/0017-admin-lists-read-through-indexes.md):

* the unfiltered list: ``pg_class.reltuples`` of the model's table (kept by autovacuum and
  ANALYZE; ``-1`` for a table never analyzed, then the EXPLAIN below is used);
* a filtered or searched list: the row estimate of ``EXPLAIN (FORMAT JSON)`` of the list's
  query (no ordering, no LIMIT);

and counts exactly when the estimate is below :data:`EXACT_BELOW` (a small count is cheap,
and the estimate of a small or filtered table is the least reliable). That count stops at
:data:`COUNT_AT_MOST` rows: a list the planner took for small but that is not (a condition
whose selectivity it cannot know) costs a bounded count, and shows that many rows.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.utils.functional import cached_property

from .. import sql

#: Below this estimate the paginator counts exactly...
EXACT_BELOW = 10_000
#: ...up to this many rows.
COUNT_AT_MOST = 100_000


def _table_estimate(queryset: QuerySet[Any]) -> int | None:
    """``pg_class.reltuples`` of the queryset's table; None when never analyzed."""
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(sql.query("admin.sql", "table_estimate"), [queryset.model._meta.db_table])
        row = cursor.fetchone()
    if row is None or row[0] < 0:
        return None
    return int(row[0])


def _plan_estimate(queryset: QuerySet[Any]) -> int:
    """The planner's row estimate for the queryset (its top plan node's "Plan Rows")."""
    try:
        statement, params = queryset.order_by().query.get_compiler(using=queryset.db).as_sql()
    except EmptyResultSet:  # e.g. ``pk__in=[]``: Django knows there is nothing to run
        return 0
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {statement}", params)
        (plan,) = cursor.fetchone()
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def is_unfiltered(queryset: QuerySet[Any]) -> bool:
    """Whether the queryset is its table's every row (annotations and joins aside)."""
    query = queryset.query
    return (
        not query.where
        and not query.distinct
        and query.combinator is None
        and query.group_by is None
        and query.low_mark == 0
        and query.high_mark is None
    )


def estimate(queryset: QuerySet[Any]) -> int | None:
    """The planner's estimate of the queryset's row count (None: not PostgreSQL)."""
    if connections[queryset.db].vendor != "postgresql":
        return None
    if is_unfiltered(queryset):
        rows = _table_estimate(queryset)
        if rows is not None:
            return rows
    return _plan_estimate(queryset)


class EstimatedCountPaginator(Paginator):
    """``count`` is the planner's estimate, exact below :data:`EXACT_BELOW` (up to
    :data:`COUNT_AT_MOST`)."""

    exact_below = EXACT_BELOW
    count_at_most = COUNT_AT_MOST

    @cached_property
    def count(self) -> int:
        object_list = self.object_list
        if isinstance(object_list, QuerySet):
            rows = estimate(object_list)
            if rows is not None:
                if rows >= self.exact_below:
                    return rows
                return object_list.order_by()[: self.count_at_most].count()
        return super().count
