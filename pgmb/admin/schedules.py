"""Schedules in the admin: the list with each schedule's next run and last runs; the add,
change and delete pages (Django's add, change and delete permissions); the pause and resume
actions (granted by ``pgmb.pause_schedule``, logged as ``LogEntry`` rows, as for queues and
workers: :mod:`.pausing`).

Every write goes through the API (:mod:`pgmb.schedules`: ``pgmb.schedule``,
``pgmb.pause_schedule``, ``pgmb.unschedule``), which checks the schedule and computes its
next due time, as for ``manage.py pgmb_schedule`` and SQL (:mod:`.schedule_form`). A
schedule's name is its identity there (``pgmb.schedule`` creates or changes the schedule of
that name): set when it is added, read-only after. Its runs are written by the loops that
fire it; its change page shows the next run and the last runs, each with its message.
"""

from __future__ import annotations

import datetime
from typing import Any

from django.contrib import admin
from django.contrib.postgres.functions import TransactionNow
from django.db import IntegrityError, router
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.timesince import timesince
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .. import schedules
from ..models import Message, Schedule
from . import pausing
from .common import badge, refuse_unpermitted
from .schedule_form import ScheduleForm, write

#: How many of the last runs the list shows (the row keeps up to 10, the page shows all).
LAST_RUNS_SHOWN = 3

#: What only the loops that fire a schedule write: shown on its change page.
RUN_FIELDS = ("next_run", "last_runs_listed", "runs", "last_error", "created_at")


def _span(span: datetime.timedelta) -> str:
    """``42 s`` under a minute (timesince would say "0 minutes"), else ``3 hours, 5 minutes``."""
    if span < datetime.timedelta(minutes=1):
        return gettext("%(n)d s") % {"n": span.total_seconds()}
    now = timezone.now()
    return timesince(now - span, now)


def _when(moment: Any) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S")


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
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
        refuse_unpermitted(self, request, (*pausing.SCHEDULE_ACTIONS, "delete_selected"))
        return super().changelist_view(request, extra_context)

    def get_fieldsets(self, request: HttpRequest, obj: Schedule | None = None) -> Any:
        when = ["cron", "every", "timezone", "missed", "paused"]
        message = ["routing_key", "body", "headers"]
        if obj is None:
            return [(None, {"fields": ["name", *when]}), (_("Message"), {"fields": message})]
        if obj.task is not None:
            message.append("task")
        return [
            (None, {"fields": ["name", *when]}),
            (_("Message"), {"fields": message}),
            (_("Runs"), {"fields": list(RUN_FIELDS)}),
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Schedule | None = None) -> Any:
        # Pausing is granted by its own permission, as in the list's actions.
        paused = () if pausing.can_pause_schedules(request) else ("paused",)
        if obj is None:
            return paused
        return ("name", "task", *RUN_FIELDS, *paused)

    def save_model(
        self, request: HttpRequest, obj: Schedule, form: ModelForm, change: bool
    ) -> None:
        name = obj.name
        schedule_id = write(form.cleaned_data, name, obj.task if change else None)
        using = router.db_for_write(Schedule)
        if (
            not change
            and not Schedule.objects.using(using)
            .filter(pk=schedule_id, created_at=TransactionNow())
            .exists()
        ):
            # Added by someone else since the form checked the name: pgmb.schedule changed
            # theirs. Refused, and the request's transaction rolls back.
            raise IntegrityError(f'schedule "{name}" was added meanwhile')
        if "paused" in form.changed_data:
            (schedules.pause if form.cleaned_data["paused"] else schedules.resume)(
                name, using=using
            )
        obj.pk = schedule_id
        obj._state.adding = False
        obj.refresh_from_db()

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        schedules.unschedule(obj.name, using=router.db_for_write(Schedule))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        using = router.db_for_write(Schedule)
        for name in queryset.values_list("name", flat=True):
            schedules.unschedule(name, using=using)

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
            ", ", "<span>{}</span>", ((_when(due),) for due in obj.last_runs[:LAST_RUNS_SHOWN])
        )

    @admin.display(description=_("next run"))
    def next_run(self, obj: Schedule) -> SafeString:
        due = obj.next_run_at
        now = timezone.now()
        if obj.paused:
            note = gettext("paused: fires nothing until resumed")
        elif due > now:
            note = gettext("in %(time)s") % {"time": _span(due - now)}
        else:
            note = gettext("due %(time)s ago: fires when a dispatcher or the loop runs") % {
                "time": _span(now - due)
            }
        return format_html('<span class="pgmb-next-run">{}</span> ({})', _when(due), note)

    @admin.display(description=_("last runs"))
    def last_runs_listed(self, obj: Schedule) -> SafeString:
        """Each due time fired (newest first, up to 10), with the message it published
        (``pgmb.schedule_message_id``) while that message is stored."""
        if not obj.last_runs:
            return format_html("{}", gettext("none yet"))
        ids = [(due, schedules.message_id(obj.pk, due)) for due in obj.last_runs]
        stored = set(
            Message.objects.filter(pk__in=[m for _due, m in ids]).values_list("pk", flat=True)
        )
        return format_html(
            '<ol class="pgmb-last-runs" style="margin:0;padding-left:1.5em">{}</ol>',
            format_html_join(
                "",
                "<li>{}</li>",
                (
                    (
                        format_html(
                            '{} <a href="{}">{}</a>',
                            _when(due),
                            reverse("admin:pgmb_message_change", args=[message]),
                            gettext("message"),
                        )
                        if message in stored
                        else format_html("{} ({})", _when(due), gettext("message removed")),
                    )
                    for due, message in ids
                ),
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
