"""A worker's delivery controls, read and set by name: its rate, its cap on requests in
flight and its answers that stop retries (docs/delivery.md). The rules are the database's
(``pgmb.prepare_worker`` refuses a bad value, whoever writes it: the admin, this, SQL), so
a refusal raises the database's error and changes nothing::

    from pgmb import worker_controls
    worker_controls.set_controls("billing", max_in_flight=2)
    worker_controls.set_controls("billing", max_in_flight=None)   # no cap
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from .models import Worker

#: What ``set_controls`` leaves as it is (None is a value: no cap).
UNCHANGED: Any = object()


@dataclass(frozen=True)
class Controls:
    """A worker's controls as stored."""

    name: str
    rps: int
    max_in_flight: int | None
    dead_statuses: list[str]
    retried_statuses: list[str]


_FIELDS = ("rps", "max_in_flight", "dead_statuses", "retried_statuses")


def controls(name: str, *, using: str | None = None) -> Controls | None:
    """The named worker's controls (None: no such worker)."""
    row = Worker.objects.using(using).filter(name=name).values_list("name", *_FIELDS).first()
    return None if row is None else Controls(*row)


def set_controls(
    name: str,
    *,
    rps: int = UNCHANGED,
    max_in_flight: int | None = UNCHANGED,
    dead_statuses: list[str] = UNCHANGED,
    retried_statuses: list[str] = UNCHANGED,
    using: str | None = None,
) -> Controls | None:
    """Set the given controls of the named worker in one statement; running dispatchers
    follow them at their next claim. Returns the controls as stored (statuses normalised),
    None when no worker has that name."""
    given = {
        "rps": rps,
        "max_in_flight": max_in_flight,
        "dead_statuses": dead_statuses,
        "retried_statuses": retried_statuses,
    }
    changes = {field: value for field, value in given.items() if value is not UNCHANGED}
    with transaction.atomic(using=using):
        if changes and not Worker.objects.using(using).filter(name=name).update(**changes):
            return None
        return controls(name, using=using)
