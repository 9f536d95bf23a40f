"""The list filters of the message lists, each answered through an index on big tables.

Django's stock filters would do for the small tables, but two of them cost a whole table on
a big one: ``AllValuesFieldListFilter`` (a ``SELECT DISTINCT`` of the column on every page
view, for its choices) and ``date_hierarchy`` (the same for the dates). The filters here
have fixed choices, or take them from the small queue and worker tables, and say how their
rows can be found: see docs/decisions/0017-admin-lists-read-through-indexes.md.

A queue's rows of the hot tables are indexed only in parts (partial indexes: a delivery's
ready rows, an attempt's acknowledged and failed ones): :attr:`QueueFilter.parts` names
those parts as an ``OR``, which PostgreSQL turns into one index scan per part (a BitmapOr)
for a small queue, where a plain ``queue_id = …`` could only be answered by reading the
table.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.timezone import now
from django.utils.translation import gettext_lazy as _

from ..models import Queue, Worker

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise


def _uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError as exc:
        raise IncorrectLookupParameters(f"not a UUID: {value!r}") from exc


class QueueFilter(admin.SimpleListFilter):
    """By queue: the queues are listed from their own (small) table.

    The parameter is Django's own ``queue__id__exact``, so links that other pages build
    (the queue list's dead-letter counts) keep working.
    """

    title = _("queue")
    parameter_name = "queue__id__exact"
    #: The parts of the model's rows that its partial indexes on ``queue_id`` cover
    #: (together: every row), or None when a plain index on ``queue_id`` exists.
    parts: Q | None = None

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin
    ) -> Iterable[tuple[str, StrOrPromise]]:
        return [(str(pk), name) for pk, name in Queue.objects.values_list("pk", "name")]

    def queues(self, value: str) -> Q:
        return Q(queue_id=_uuid(value))

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        value = self.value()
        if value is None:
            return None
        matching = self.queues(value)
        return queryset.filter(matching if self.parts is None else matching & self.parts)


class WorkerFilter(QueueFilter):
    """By worker: the rows of the worker's queues, named by id.

    The ids are read first (one small query): ``queue_id IN (SELECT ...)`` gives the
    planner no idea how many rows the worker's queues hold, and a wrong guess makes the
    paginator count a big list it took for a small one.
    """

    title = _("worker")
    parameter_name = "worker"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin
    ) -> Iterable[tuple[str, StrOrPromise]]:
        return [(str(pk), name) for pk, name in Worker.objects.values_list("pk", "name")]

    def queues(self, value: str) -> Q:
        ids = Queue.objects.filter(worker_id=_uuid(value)).values_list("pk", flat=True)
        return Q(queue_id__in=list(ids))


#: A delivery is ready, leased or waiting (the CHECK pgmb_delivery_state_valid): the rows
#: of pgmb_delivery_due, pgmb_delivery_leased and pgmb_delivery_waiting.
DELIVERY_PARTS = Q(state="ready") | Q(state="leased") | Q(state="waiting")
#: An attempt is acknowledged or not: the rows of pgmb_attempt_acked and of
#: pgmb_attempt_failed.
ATTEMPT_PARTS = Q(outcome="ack") | ~Q(outcome="ack")


class DeliveryQueueFilter(QueueFilter):
    parts = DELIVERY_PARTS


class DeliveryWorkerFilter(WorkerFilter):
    parts = DELIVERY_PARTS


class AttemptQueueFilter(QueueFilter):
    parts = ATTEMPT_PARTS


class AttemptWorkerFilter(WorkerFilter):
    parts = ATTEMPT_PARTS


class DeliveryStatusFilter(admin.SimpleListFilter):
    """ready / delayed / leased / waiting, as the status column shows them
    (:func:`pgmb.admin.common.delivery_status`): a lease that ran out is ready."""

    title = _("status")
    parameter_name = "status"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin
    ) -> Iterable[tuple[str, StrOrPromise]]:
        return (
            ("ready", _("ready")),
            ("delayed", _("delayed")),
            ("leased", _("leased")),
            ("waiting", _("waiting")),
        )

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        moment = now()
        if self.value() == "ready":
            return queryset.filter(Q(state="ready") | Q(state="leased"), available_at__lte=moment)
        if self.value() == "delayed":
            return queryset.filter(state="ready", available_at__gt=moment)
        if self.value() == "leased":
            return queryset.filter(state="leased", available_at__gt=moment)
        if self.value() == "waiting":
            return queryset.filter(state="waiting")
        return None


class StatusClassFilter(admin.SimpleListFilter):
    """By the class of an HTTP status: fixed choices, never a DISTINCT over the table."""

    title = _("status code")
    parameter_name = "status_code_class"
    #: The model's status column.
    field = "status_code"
    #: What the failure classes (3xx, 4xx, 5xx, no response) imply about the rows, so
    #: that a partial index of failures can find them; None: nothing.
    failures: Q | None = None

    CLASSES = {"2xx": (200, 300), "3xx": (300, 400), "4xx": (400, 500), "5xx": (500, 600)}

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin
    ) -> Iterable[tuple[str, StrOrPromise]]:
        return (
            ("2xx", "2xx"),
            ("3xx", "3xx"),
            ("4xx", "4xx"),
            ("5xx", "5xx"),
            ("none", _("no response")),
        )

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        value = self.value()
        if value is None:
            return None
        if value == "none":
            condition = Q(**{f"{self.field}__isnull": True})
        elif value in self.CLASSES:
            low, high = self.CLASSES[value]
            condition = Q(**{f"{self.field}__gte": low, f"{self.field}__lt": high})
        else:
            raise IncorrectLookupParameters(f"unknown status class: {value!r}")
        if value != "2xx" and self.failures is not None:
            condition &= self.failures
        return queryset.filter(condition)


class AttemptStatusFilter(StatusClassFilter):
    """An attempt's status; 3xx, 4xx, 5xx and no response list failed attempts only (an
    acknowledgement through SQL may carry no status: it is not a failure, and neither is an
    'unsent' lease, which asked no worker anything, a pull queue's 'archived' message, an
    expiry ('ttl') or a cancel ('canceled'))."""

    failures = ~Q(outcome__in=["ack", "unsent", "archived", "ttl", "canceled"])


class DeadLetterStatusFilter(StatusClassFilter):
    """A dead letter's last status."""

    title = _("last status")
    parameter_name = "last_status_class"
    field = "last_status"
