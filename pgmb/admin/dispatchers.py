"""Dispatchers that registered themselves: which run, which went silent, which stopped.

Read-only: rows are written by the dispatchers (``pgmb.dispatcher_start``, ``_beat``,
``_stop``). The state comes from the database's own rule (``pgmb.dispatcher_state``), in
the list's one query, so the admin and the SQL view ``pgmb.dispatchers`` never disagree.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import CharField, F, Func, QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import DispatcherProcess
from .common import ReadOnlyMixin, badge

if TYPE_CHECKING:
    from django.contrib.admin.filters import _ListFilterChoices
    from django_stubs_ext import StrOrPromise

#: Badge colours of the states.
_TONES = {"running": "good", "gone": "bad", "stopped": "quiet"}


def state_badge(state: str) -> SafeString:
    """running, gone or stopped as a small coloured label."""
    return badge("state", state, state, _TONES.get(state, "quiet"))


class DispatcherState(Func):
    """``pgmb.dispatcher_state(heartbeat_at, stopped_at)``: running, gone or stopped."""

    function = "pgmb.dispatcher_state"
    output_field = CharField()


class StateFilter(admin.SimpleListFilter):
    """By state; by default the dispatchers that have not stopped (running and gone)."""

    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("running", _("running")),
            ("gone", _("gone")),
            ("stopped", _("stopped")),
            ("all", _("all")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value is None:
            return queryset.filter(stopped_at__isnull=True)
        if value == "all":
            return queryset
        return queryset.filter(state=value)

    def choices(self, changelist: ChangeList) -> Iterator[_ListFilterChoices]:
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": _("not stopped"),
        }
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == str(lookup),
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }


@admin.register(DispatcherProcess)
class DispatcherAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "kind",
        "host",
        "pid",
        "queue_list",
        "started_at",
        "heartbeat_at",
        "state_badge",
        "in_flight",
        "delivered",
        "failed",
    )
    list_display_links = None
    list_filter = (StateFilter, "kind")
    search_fields = ("host",)
    actions = None

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .annotate(state=DispatcherState(F("heartbeat_at"), F("stopped_at")))
        )

    @admin.display(description=_("queues"))
    def queue_list(self, obj: DispatcherProcess) -> StrOrPromise:
        return ", ".join(obj.queues) if obj.queues is not None else _("all")

    @admin.display(description=_("state"), ordering="stopped_at")
    def state_badge(self, obj: DispatcherProcess) -> SafeString:
        return state_badge(getattr(obj, "state", ""))
