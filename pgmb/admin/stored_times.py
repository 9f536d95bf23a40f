"""Times as the admin shows them, whatever is stored.

pgmb refuses times outside the years 1 to 9999 (pgmb.valid_time), but rows stored before
that rule, or by a writer that disabled the triggers, may hold ``infinity`` or the year
294276: no ``datetime`` holds them, and loading one fails the whole page. So the lists
never load a stored time as such: each time column is deferred and read as two
annotations, the time itself where a ``datetime`` holds it in every time zone, and
PostgreSQL's text of it otherwise (docs/decisions/0053-times-pgmb-stores.md).
"""

from __future__ import annotations

from datetime import datetime, timezone

from django.db.models import (
    Case,
    DateTimeField,
    Expression,
    F,
    Q,
    QuerySet,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Cast, Greatest, Least

#: A day inside what a ``datetime`` holds at either end, so that showing a time in any
#: time zone (offsets are under a day) cannot overflow.
FIRST = datetime(1, 1, 2, tzinfo=timezone.utc)
LAST = datetime(9999, 12, 31, tzinfo=timezone.utc)

SHOWN = "{}_shown"
STORED = "{}_stored"
CLAMPED = "{}_clamped"


def readable_times(queryset: QuerySet, *fields: str) -> QuerySet:
    """``queryset`` with ``fields`` (time columns) deferred and readable through
    :func:`shown_time` and :func:`comparable_time`, whatever they hold."""
    annotations: dict[str, Expression] = {}
    for field in fields:
        inside = Q(**{f"{field}__gte": FIRST, f"{field}__lt": LAST})
        annotations[SHOWN.format(field)] = Case(
            When(inside, then=F(field)), default=None, output_field=DateTimeField()
        )
        annotations[STORED.format(field)] = Cast(field, TextField())
        # The same order against any time a datetime holds (now(), say): what ready or
        # delayed is decided by.
        annotations[CLAMPED.format(field)] = Greatest(
            Least(F(field), Value(LAST)), Value(FIRST), output_field=DateTimeField()
        )
    return queryset.defer(*fields).annotate(**annotations)


def shown_time(obj: object, field: str) -> datetime | str:
    """The time of ``field`` on a row of :func:`readable_times`: a ``datetime`` (the admin
    formats it in the user's time zone), else the stored value as PostgreSQL prints it."""
    shown: datetime | None = getattr(obj, SHOWN.format(field))
    if shown is not None:
        return shown
    stored: str = getattr(obj, STORED.format(field))
    return stored


def comparable_time(obj: object, field: str) -> datetime:
    """The time of ``field`` on a row of :func:`readable_times`, moved within the years a
    ``datetime`` holds: the same order against any such time."""
    clamped: datetime = getattr(obj, CLAMPED.format(field))
    return clamped
