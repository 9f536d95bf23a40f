"""The operator's dashboard: every queue, worker and running dispatcher on one page, with
the last hour's charts, at ``/admin/pgmb/dashboard/`` (URL name ``admin:pgmb_dashboard``).

For staff with the permission ``pgmb.view_dashboard`` (:data:`VIEW_PERMISSION`): the admin
site's ``admin_view`` sends anyone else to its login page, staff without it get 403. The
admin index lists models only, so the dashboard is the admin of a model without a table
(:class:`pgmb.models.Dashboard`): the index and pgmb's app index show a "Dashboard" entry,
and its URLs are the admin site's own, with nothing to add to a project's URLconf.

Its figures come from where the lists' do: the queue and worker tables from
:mod:`pgmb.metrics` (``pgmb.metrics_all()``, ``pgmb.worker_metrics()``), the dispatchers
from :mod:`pgmb.dispatcher_registry`, the charts from
:func:`pgmb.dashboard_series.series`, all read in one transaction (one ``now()``: the
same last hour). GET parameters choose what the charts show: ``queue`` (a queue's name)
or ``worker`` (a worker's: its queues), and ``range`` (``1h``, live, minute by minute;
``24h`` and ``7d``, hour by hour from the hourly statistics of the Spark pipeline's
``stats`` job, :mod:`pgmb.hourly_stats`). The page reloads itself every
``PGMB["DASHBOARD_REFRESH"]`` seconds (0: never).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from .. import conf, dashboard_series, dispatcher_registry, hourly_stats, metrics
from ..dispatcher_registry import DispatcherInfo
from ..metrics import QueueMetrics, WorkerMetrics
from ..models import Dashboard
from . import breakers, charts, health, pausing
from .dispatchers import state_badge

#: Who sees the dashboard (and reads /metrics when logged in): staff with this permission.
VIEW_PERMISSION = "pgmb.view_dashboard"

#: Minutes between the named ticks of the time axis: of the live hour, of 15 minutes.
TICK_MINUTES = 10
RECENT_TICK_MINUTES = 5


class ScopeForm(forms.Form):
    """What the charts show: a range, and every queue, one queue or one worker's queues."""

    range = forms.ChoiceField(required=False, label=_("Range"))
    queue = forms.ChoiceField(required=False, label=_("Queue"))
    worker = forms.ChoiceField(required=False, label=_("Worker"))

    def __init__(self, data: Any, *, queues: Sequence[str], workers: Sequence[str]) -> None:
        super().__init__(data)
        range_field: Any = self.fields["range"]
        range_field.choices = [(r.key, r.label) for r in dashboard_series.RANGES.values()]
        queue_field: Any = self.fields["queue"]
        queue_field.choices = [("", _("every queue")), *((n, n) for n in queues)]
        worker_field: Any = self.fields["worker"]
        worker_field.choices = [("", _("every worker")), *((n, n) for n in workers)]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("queue") and data.get("worker"):
            raise forms.ValidationError(_("Choose a queue or a worker, not both."))
        return data

    def chosen(self) -> tuple[dashboard_series.Range | None, str | None, str | None]:
        """The valid form's range, queue and worker (None: not chosen)."""
        data = self.cleaned_data
        return (
            dashboard_series.RANGES.get(data.get("range") or ""),
            data.get("queue") or None,
            data.get("worker") or None,
        )

    def show_range(self, range_: dashboard_series.Range) -> None:
        """Show ``range_`` as chosen: the one the page opened on when none was asked for."""
        self.data = {**self.data, "range": range_.key}


@dataclass(frozen=True, slots=True)
class Chart:
    title: str
    svg: SafeString
    #: A line under the chart: the totals the lists show.
    note: str = ""
    #: A link under the chart, and its text.
    link: str = ""
    link_text: str = ""


def _step_names(
    points: Sequence[dashboard_series.Point], range_: dashboard_series.Range
) -> tuple[list[str], list[int]]:
    """Each point's local time, and the indexes of the named ticks: round ten minutes in
    the live hour (five in its last 15 minutes), every sixth hour in a day, midnights in a week."""
    times = [timezone.localtime(p.at) for p in points]
    if range_.live:
        every = TICK_MINUTES if range_.span > dashboard_series.RECENT.span else RECENT_TICK_MINUTES
        return (
            [t.strftime("%H:%M") for t in times],
            [i for i, t in enumerate(times) if t.minute % every == 0],
        )
    if range_.span <= dashboard_series.DAY.span:
        return (
            [t.strftime("%H:%M") for t in times],
            [i for i, t in enumerate(times) if t.hour % 6 == 0],
        )
    return (
        [t.strftime("%a %H:%M") for t in times],
        [i for i, t in enumerate(times) if t.hour == 0],
    )


def build_charts(
    points: Sequence[dashboard_series.Point],
    scope: str,
    range_: dashboard_series.Range = dashboard_series.LIVE,
) -> list[Chart]:
    """The dashboard's charts of ``points``; ``scope`` names what they cover. The live hour
    has four; the hourly ranges of the statistics two (they have no depth, no unrouted)."""
    x, ticks = _step_names(points, range_)
    range_label = range_.label.capitalize()
    if not range_.live:
        return _hourly_charts(points, scope, range_label, x, ticks)
    values = {
        field: [getattr(p, field) for p in points]
        for field in dashboard_series.Point.__dataclass_fields__
        if field != "at"
    }
    depth = gettext("Queue depth (live deliveries), %(scope)s")
    latency = gettext("Request latency per minute, %(scope)s")
    unrouted = gettext("Unrouted messages per minute, every queue")
    return [
        _outcomes_chart(points, gettext("per minute"), scope, range_label, x, ticks),
        Chart(
            depth % {"scope": scope},
            charts.line_chart(
                depth % {"scope": scope},
                x,
                ticks,
                [charts.Series(gettext("depth"), values["depth"], charts.BLUE)],
            ),
            gettext("Ready, delayed and leased deliveries at the end of each minute; now: %(n)d.")
            % {"n": values["depth"][-1] if points else 0},
        ),
        Chart(
            latency % {"scope": scope},
            charts.line_chart(
                latency % {"scope": scope},
                x,
                ticks,
                [
                    charts.Series("p50", values["latency_p50_ms"], charts.BLUE),
                    charts.Series("p95", values["latency_p95_ms"], charts.ORANGE),
                ],
                unit="ms",
                steps=True,
            ),
            gettext("How long the workers took to answer; no line: no request that minute."),
        ),
        Chart(
            unrouted,
            charts.bar_chart(
                unrouted,
                x,
                ticks,
                [charts.Series(gettext("unrouted"), values["unrouted"], charts.GREY)],
            ),
            ngettext(
                "%(range)s: %(n)d published message matched no queue.",
                "%(range)s: %(n)d published messages matched no queue.",
                sum(values["unrouted"]),
            )
            % {"range": range_label, "n": sum(values["unrouted"])},
            reverse("admin:pgmb_message_changelist") + "?routed=no",
            gettext("Messages that matched no queue"),
        ),
    ]


def _outcomes_chart(
    points: Sequence[dashboard_series.Point],
    per: str,
    scope: str,
    range_label: str,
    x: list[str],
    ticks: list[int],
) -> Chart:
    """Delivered, failed and dead-lettered attempts per step (``per``: "per minute", …)."""
    title = gettext("Delivered, failed and dead-lettered %(per)s, %(scope)s") % {
        "per": per,
        "scope": scope,
    }
    totals = {
        field: sum(getattr(p, field) for p in points)
        for field in ("delivered", "failed", "dead_lettered")
    }
    series = [
        charts.Series(gettext("delivered"), [p.delivered for p in points], charts.GREEN),
        charts.Series(gettext("failed"), [p.failed for p in points], charts.RED),
        charts.Series(
            gettext("dead-lettered"), [p.dead_lettered for p in points], charts.PURPLE, True
        ),
    ]
    summary = gettext(
        "%(range)s: %(delivered)d delivered, %(failed)d failed (%(dead_lettered)d of "
        "them dead-lettered)."
    ) % {"range": range_label, **totals}
    # Expirations by time to live are counted live only (not by the hourly statistics);
    # not attempts, so not among the failed ('expired' alone is a lease's).
    if points and all(p.expired_ttl is not None for p in points):
        ttl = [p.expired_ttl or 0 for p in points]
        series.append(charts.Series(gettext("expired (TTL)"), ttl, charts.ORANGE, True))
        summary += " " + gettext("%(n)d expired (TTL) before they were delivered.") % {
            "n": sum(ttl)
        }
    return Chart(title, charts.line_chart(title, x, ticks, series), summary)


def _hourly_charts(
    points: Sequence[dashboard_series.Point],
    scope: str,
    range_label: str,
    x: list[str],
    ticks: list[int],
) -> list[Chart]:
    latency = gettext("Latency from publishing to the ack per hour, %(scope)s")
    return [
        _outcomes_chart(points, gettext("per hour"), scope, range_label, x, ticks),
        Chart(
            latency % {"scope": scope},
            charts.line_chart(
                latency % {"scope": scope},
                x,
                ticks,
                [
                    charts.Series("p50", [p.latency_p50_ms for p in points], charts.BLUE),
                    charts.Series("p95", [p.latency_p95_ms for p in points], charts.ORANGE),
                ],
                unit="ms",
                steps=True,
            ),
            gettext("Over the acknowledged deliveries; no line: none that hour."),
        ),
    ]


def statistics_note(computed_until: datetime.datetime | None) -> str:
    """Where an hourly range's figures come from, and how fresh they are."""
    if computed_until is None:
        return gettext(
            "No hourly statistics yet: they are computed by the Spark pipeline's stats job "
            "(manage.py pgmb_pipeline stats)."
        )
    return gettext(
        "From the hourly statistics of the Spark pipeline's stats job, computed up to the "
        "hour of %(hour)s (manage.py pgmb_pipeline stats)."
    ) % {"hour": timezone.localtime(computed_until).strftime("%Y-%m-%d %H:%M")}


def queue_rows(queues: Sequence[QueueMetrics]) -> list[dict[str, Any]]:
    """The queue table: the columns of the queue list, from the same figures."""
    return [
        {
            "name": q.queue_name,
            "state": pausing.badge("paused" if q.paused else "running"),
            "pending": q.queue_length,
            "ready": q.queue_visible_length,
            "delayed": q.queue_length - q.queue_visible_length - q.leased,
            "leased": q.leased,
            "retrying": q.retrying,
            "dead_letters": q.dead_letters,
            "oldest_due": health.age(q.oldest_msg_age_sec),
            # Unknown without history (None: not summed, shown as such).
            "delivered_last_hour": q.delivered_last_hour if q.keeps_history else None,
            "failed_last_hour": q.failed_last_hour,
        }
        for q in queues
    ]


def history_note(queues: Sequence[QueueMetrics]) -> str | None:
    """What the dashboard cannot count: the queues that keep no history, if any."""
    names = [q.queue_name for q in queues if not q.keeps_history]
    if not names:
        return None
    return gettext(
        "Keep no history: %(names)s. Their deleted messages leave no trace, so they are "
        "missing from the delivered counts, the charts' throughput and latency, and the "
        "hourly statistics; archived, retried and dead-lettered messages are counted."
    ) % {"names": ", ".join(names)}


#: The queue table's columns that add up in its "all queues" row.
SUMMED = (
    "pending",
    "ready",
    "delayed",
    "leased",
    "retrying",
    "dead_letters",
    "delivered_last_hour",
    "failed_last_hour",
)


def worker_rows(workers: Sequence[WorkerMetrics]) -> list[dict[str, Any]]:
    """The worker table: the columns of the worker list, from the same figures."""
    return [
        {
            "name": w.worker_name,
            "health": health.health_badge(health.worker_health(w)),
            "breaker": breakers.badge(w.breaker_state, w.breaker_reason, w.breaker_until),
            "requests_last_hour": w.requests_last_hour,
            "success_rate": health.percent(w.success_rate),
            "p95_latency": health.milliseconds(w.p95_latency_ms),
            "last_success": health.ago(w.last_success_at),
            "last_error": health.error_text(w),
            "consecutive_failures": w.consecutive_failures,
        }
        for w in workers
    ]


def dispatcher_rows(found: Sequence[DispatcherInfo]) -> list[dict[str, Any]]:
    """Running and gone dispatchers (stopped ones are in the dispatcher list)."""
    return [
        {
            "kind": d.kind,
            "host": d.host,
            "pid": d.pid,
            "queues": ", ".join(d.queues) if d.queues is not None else gettext("all"),
            "started": d.started_at,
            "heartbeat": d.heartbeat_at,
            "heartbeat_ago": health.ago(d.heartbeat_at),
            "state": state_badge(d.state),
            "in_flight": d.in_flight,
            "delivered": d.delivered,
            "failed": d.failed,
        }
        for d in found
        if d.state != "stopped"
    ]


@admin.register(Dashboard)
class DashboardAdmin(admin.ModelAdmin):
    """The dashboard page in place of a changelist."""

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.dashboard_view)
        return [
            path("", view, name="pgmb_dashboard"),
            # The name the admin index links a model's entry to.
            path("", view, name="pgmb_dashboard_changelist"),
        ]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(VIEW_PERMISSION)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def dashboard_view(self, request: HttpRequest) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        settings = conf.get()
        using = settings.DATABASE
        with transaction.atomic(using=using):
            queues = metrics.queues(using)
            workers = metrics.workers(using)
            form = ScopeForm(
                request.GET,
                queues=[q.queue_name for q in queues],
                workers=[w.worker_name for w in workers],
            )
            points = None
            computed_until = None
            if form.is_valid():
                asked, queue, worker = form.chosen()
                range_ = asked or dashboard_series.LIVE
                points = dashboard_series.series(range_, queue, worker, using=using)
                if asked is None:
                    range_, points = dashboard_series.fitted(points)
                    form.show_range(range_)
                if not range_.live:
                    computed_until = hourly_stats.latest(using=using)
            found = dispatcher_registry.dispatchers(using=using)

        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Dashboard"),
            "form": form,
            "refresh": settings.DASHBOARD_REFRESH,
            "rendered_at": timezone.localtime(),
            "queues": queue_rows(queues),
            "workers": worker_rows(workers),
            "dispatchers": dispatcher_rows(found),
            "dispatchers_url": reverse("admin:pgmb_dispatcherprocess_changelist"),
        }
        context["queue_totals"] = {
            key: sum(row[key] for row in context["queues"] if row[key] is not None)
            for key in SUMMED
        }
        context["history_note"] = history_note(queues)
        if points is not None:
            if queue:
                scope = gettext("queue %(name)s") % {"name": queue}
            elif worker:
                scope = gettext("queues of worker %(name)s") % {"name": worker}
            else:
                scope = gettext("every queue")
            context.update(
                scope=scope,
                chosen_queue=queue,
                chosen_worker=worker,
                range=range_,
                charts=build_charts(points, scope, range_),
                statistics_note=None if range_.live else statistics_note(computed_until),
            )
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request,
            "admin/pgmb/dashboard.html",
            context,
            status=200 if points is not None else 400,
        )
