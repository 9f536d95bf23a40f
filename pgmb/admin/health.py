"""Health at a glance in the queue and worker lists: the figures of :mod:`pgmb.metrics`.

The columns read ``pgmb.metrics_all()`` and ``pgmb.worker_metrics()`` (through
:func:`pgmb.metrics.queues` and :func:`pgmb.metrics.workers`), once per changelist page for
the page's rows: the admin shows the numbers Prometheus scrapes, not a second computation
of them. :class:`MetricsColumnsMixin` loads them after the page's rows and hangs each
row's figures on it; the display methods only read that attribute.

A worker's health (docs/decisions/0017-admin-lists-read-through-indexes.md), first match wins:

* **paused**: the worker is not active;
* **failing**: :data:`FAILING_CONSECUTIVE` or more failures since its last success, or a
  success rate under :data:`FAILING_RATE` over the last hour with at least
  :data:`FAILING_MIN_REQUESTS` requests;
* **idle**: no request in the last hour;
* **healthy**: otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.timesince import timesince
from django.utils.translation import gettext_lazy as _

from ..metrics import QueueMetrics, WorkerMetrics
from .common import badge

if TYPE_CHECKING:
    from django.contrib import admin

    _Base = admin.ModelAdmin[Any]
else:
    _Base = object

#: Failures since the last success that make a worker failing.
FAILING_CONSECUTIVE = 3
#: A success rate over the last hour below this makes a worker failing...
FAILING_RATE = 0.5
#: ...when it had at least this many requests in that hour (a few are noise).
FAILING_MIN_REQUESTS = 10
#: Characters of the last error shown in the list (the whole text is its title).
ERROR_CHARS = 60

#: The attribute a row's figures are hung on.
ATTRIBUTE = "pgmb_metrics"

HEALTH_LABELS = {
    "healthy": _("healthy"),
    "failing": _("failing"),
    "idle": _("idle"),
    "paused": _("paused"),
}
_TONES = {"healthy": "good", "failing": "bad", "idle": "quiet", "paused": "held"}
EMPTY = "-"


def worker_health(figures: WorkerMetrics) -> str:
    """healthy, failing, idle or paused (the rules of this module's docstring)."""
    if not figures.active:
        return "paused"
    if figures.consecutive_failures >= FAILING_CONSECUTIVE:
        return "failing"
    if (
        figures.requests_last_hour >= FAILING_MIN_REQUESTS
        and figures.success_rate is not None
        and figures.success_rate < FAILING_RATE
    ):
        return "failing"
    if figures.requests_last_hour == 0:
        return "idle"
    return "healthy"


def health_badge(state: str, title: str = "") -> SafeString:
    return badge("health", state, HEALTH_LABELS[state], _TONES[state], title)


def figures_of(obj: Any) -> Any:
    """The figures hung on a row, or None (a row rendered outside a changelist page)."""
    return getattr(obj, ATTRIBUTE, None)


def age(seconds: float | None) -> str:
    """A duration in seconds, short: 45s, 12m, 3h 5m, 2d 4h."""
    if seconds is None:
        return EMPTY
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def ago(moment: datetime | None) -> str:
    return EMPTY if moment is None else _("%(time)s ago") % {"time": timesince(moment)}


def percent(rate: float | None) -> str:
    """A success rate: 57.1%."""
    return EMPTY if rate is None else f"{rate:.1%}"


def milliseconds(value: float | None) -> str:
    """A latency: 67.0 ms."""
    return EMPTY if value is None else f"{value:.1f} ms"


def error_line(figures: WorkerMetrics) -> str:
    """The last error: its status and text."""
    if figures.last_error_at is None:
        return EMPTY
    status = figures.last_error_status if figures.last_error_status is not None else "-"
    return f"{status}: {figures.last_error or ''}".rstrip(": ")


def error_text(figures: WorkerMetrics) -> SafeString | str:
    """The last error: status and text, truncated, the whole of it in a title."""
    if figures.last_error_at is None:
        return EMPTY
    text = error_line(figures)
    return format_html('<span title="{}">{}</span>', text, Truncator(text).chars(ERROR_CHARS))


class MetricsColumnsMixin(_Base):
    """Loads the page's figures once, after the page's rows, and hangs them on the rows;
    an object's page gets its own and shows ``health_fields`` under "Health"."""

    #: Reads the figures of the named rows: pgmb.metrics.queues or .workers (staticmethod).
    load_metrics: Callable[..., Sequence[QueueMetrics] | Sequence[WorkerMetrics]]
    #: The figures' field holding the row's name.
    metrics_name_field: str
    #: The display methods an object's page shows, read-only: all its figures, where the
    #: list has room for a few.
    health_fields: tuple[str, ...] = ()

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            found = self.load_metrics(names=[obj.name])
            setattr(obj, ATTRIBUTE, found[0] if found else None)
        return obj

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or not self.health_fields:
            return fieldsets
        return (*fieldsets, (_("Health, as /metrics has it"), {"fields": self.health_fields}))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        found = super().get_readonly_fields(request, obj)
        return found if obj is None else (*found, *self.health_fields)

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        cl = super().get_changelist_instance(request)
        # An action's POST redirects or shows its own page: the rows are not shown.
        if request.method != "POST":
            rows = list(cl.result_list)  # the page's query, cached for the template
            if rows:
                names = [row.name for row in rows]
                by_name = {
                    getattr(f, self.metrics_name_field): f for f in self.load_metrics(names=names)
                }
                for row in rows:
                    setattr(row, ATTRIBUTE, by_name.get(row.name))
        return cl
