"""Schedules in the admin: the list with each schedule's next run and last runs, and the
pause and resume actions (granted by ``pgmb.pause_schedule``, logged as ``LogEntry`` rows,
as for queues and workers: :mod:`.pausing`).

Read-only otherwise: a schedule is written through ``pgmb.schedule`` (SQL),
:func:`pgmb.schedules.schedule` or ``manage.py pgmb_schedule``, which check its cron
expression, time zone and message; its runs are written by the loops that fire it.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from .. import schedules
from ..models import Schedule
from . import pausing
from .common import ReadOnlyMixin, badge, refuse_unpermitted

#: How many of the last runs the list shows (the row keeps up to 10).
LAST_RUNS_SHOWN = 3


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "name",
        "state",
        "when",
        "routing_key",
        "next_run_at",
        "last_runs_shown",
        "runs",
        "last_error",
    )
    list_filter = ("paused", "missed")
    search_fields = ("name", "routing_key")
    actions = pausing.SCHEDULE_ACTIONS

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        refuse_unpermitted(self, request, pausing.SCHEDULE_ACTIONS)
        return super().changelist_view(request, extra_context)

    @admin.display(description=_("state"), ordering="paused")
    def state(self, obj: Schedule) -> SafeString:
        if obj.paused:
            return badge("state", "paused", _("paused"), "held")
        return badge("state", "running", _("running"), "good")

    @admin.display(description=_("when"))
    def when(self, obj: Schedule) -> str:
        return schedules.describe(obj.cron, obj.timezone, obj.every)

    @admin.display(description=_("last runs"))
    def last_runs_shown(self, obj: Schedule) -> SafeString:
        return format_html_join(
            ", ",
            "<span>{}</span>",
            (
                (timezone.localtime(due).strftime("%Y-%m-%d %H:%M:%S"),)
                for due in obj.last_runs[:LAST_RUNS_SHOWN]
            ),
        )

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return pausing.can_pause_schedules(request)

    @admin.action(permissions=["pause"], description=_("Pause selected schedules"))
    def pause_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        pausing.set_paused(self, request, queryset, True)

    @admin.action(permissions=["pause"], description=_("Resume selected schedules"))
    def resume_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        pausing.set_paused(self, request, queryset, False)
