"""Messages, and what became of them: live deliveries, dead letters, the attempt log.

All of it is read-only here: rows move only through pgmb's SQL state machine. Dead letters
can be requeued and purged by actions (see :mod:`pgmb.admin.dead_letters`), live
deliveries cancelled and made due now (see :mod:`pgmb.admin.live_deliveries`), and messages
replayed (see :mod:`pgmb.admin.replay`), which call it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from .. import publish
from ..models import Attempt, DeadLetter, Delivery, Message, Queue
from . import dead_letters, filters, live_deliveries, replay
from .common import (
    MESSAGE_WINDOW,
    AnyOf,
    MessageSearchMixin,
    ReadOnlyInline,
    ReadOnlyMixin,
    delivery_status,
    message_link,
    queue_name_of,
    refuse_unpermitted,
    routing_key_of,
)
from .paginator import EstimatedCountPaginator
from .stored_message import attempt_timeline, duration_text, pretty_stored, stored_texts
from .stored_times import comparable_time, readable_times, shown_time

if TYPE_CHECKING:
    from django.contrib.admin.options import BaseModelAdmin
    from django_stubs_ext import StrOrPromise, WithAnnotations

    class _QueueName(TypedDict):
        queue_name: str | None

    class _RoutingKey(TypedDict):
        routing_key: str | None

    # A row of _ByMessageAdmin's list, with the routing key it annotates.
    _ByMessageRow = (
        WithAnnotations[Delivery, _RoutingKey]
        | WithAnnotations[DeadLetter, _RoutingKey]
        | WithAnnotations[Attempt, _RoutingKey]
    )

    # What _AttemptColumns is mixed into: its super() is a ModelAdmin's or an inline's.
    _ColumnsBase = BaseModelAdmin[Any]
else:
    _ColumnsBase = object


class _TimeColumns:
    """The created and due times of a message or a delivery, whatever is stored
    (:mod:`pgmb.admin.stored_times`): a list or page that shows them reads them through
    :func:`_with_times`."""

    @admin.display(description=_("created at"), ordering="created_at")
    def created_time(self, obj: Message | Delivery) -> datetime | str:
        return shown_time(obj, "created_at")

    @admin.display(description=_("available at"), ordering="available_at")
    def available_time(self, obj: Message | Delivery) -> datetime | str:
        return shown_time(obj, "available_at")


def _with_times(queryset: QuerySet) -> QuerySet:
    return readable_times(queryset, "created_at", "available_at")


def _status(obj: Delivery) -> str:
    status = delivery_status(obj.state, comparable_time(obj, "available_at"))
    # Cancelled in flight: its request's outcome will end it.
    return _("%(status)s, cancelled") % {"status": status} if obj.canceled_at else status


#: Characters of a dead letter's last error shown in the list.
SHORT_ERROR = 60

#: The attribute a message row's "routed" flag is hung on.
ROUTED = "pgmb_routed"


def routed() -> Q:
    """Whether a message reached any queue: the ``routed`` column of the view pgmb.messages.

    A routed message always has a live delivery, a dead letter or an attempt, whichever
    stage it is at; one with none of them matched no binding when it was published.
    """
    return (
        Q(Exists(Delivery.objects.filter(message=OuterRef("pk"))))
        | Q(Exists(DeadLetter.objects.filter(message=OuterRef("pk"))))
        | Q(Exists(Attempt.objects.filter(message=OuterRef("pk"))))
    )


class RoutedFilter(admin.SimpleListFilter):
    """Routed or not. "No" looks among the newest :data:`MESSAGE_WINDOW` messages only.

    Nothing records that a message matched no queue: it is the absence of rows in three
    tables, which only a probe per message can tell. Among all messages, the page (and
    the count) would probe the whole table to find a few; among the newest ten thousand,
    a page costs at most that many probes, whatever the size of the table.
    """

    title = _("routed")
    parameter_name = "routed"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin
    ) -> Iterable[tuple[str, StrOrPromise]]:
        return (
            ("yes", _("Yes")),
            (
                "no",
                _("No: matched no queue (among the newest %(n)s)") % {"n": f"{MESSAGE_WINDOW:,}"},
            ),
        )

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        if self.value() == "yes":
            return queryset.filter(routed())
        if self.value() == "no":
            newest = Message.objects.order_by("-created_at", "-id").values("pk")
            return queryset.filter(AnyOf("id", newest[:MESSAGE_WINDOW])).exclude(routed())
        return None


class DeliveryInline(_TimeColumns, ReadOnlyInline):
    model = Delivery
    verbose_name_plural = _("live deliveries")
    fields = ("queue", "status", "attempts", "available_time", "created_time")
    readonly_fields = fields
    # Each row links to the delivery's page, with its Cancel and Run now buttons.
    show_change_link = True

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return _with_times(super().get_queryset(request).select_related("queue"))

    @admin.display(description=_("status"))
    def status(self, obj: Delivery) -> str:
        return _status(obj)


class DeadLetterInline(ReadOnlyInline):
    model = DeadLetter
    fields = ("queue", "attempts", "last_status", "last_error", "created_at")
    readonly_fields = fields
    # Each row links to the dead letter's page, with its Requeue button.
    show_change_link = True

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).select_related("queue")


class _AttemptColumns(_ColumnsBase):
    """Columns shared by the attempt inline and the attempt list."""

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(queue_name=queue_name_of())

    @admin.display(description=_("queue"))
    def queue_name(self, obj: WithAnnotations[Attempt, _QueueName]) -> str:
        return obj.queue_name or f"{obj.queue_id} (deleted)"

    @admin.display(description=_("duration"), ordering="duration_ms")
    def duration(self, obj: Attempt) -> str:
        return duration_text(obj.duration_ms)


class AttemptInline(_AttemptColumns, ReadOnlyInline):
    model = Attempt
    verbose_name_plural = _("attempts")
    fields = (
        "queue_name",
        "attempt",
        "outcome",
        "status_code",
        "duration",
        "error",
        "created_at",
    )
    readonly_fields = fields
    ordering = ("created_at", "id")


@admin.register(Message)
class MessageAdmin(MessageSearchMixin, ReadOnlyMixin, _TimeColumns, admin.ModelAdmin):
    message_id_field = "id"
    list_display = ("id", "routing_key", "created_time", "available_time", "is_routed")
    list_filter = (RoutedFilter, "created_at")
    # Searched by MessageSearchMixin (search_fields only turns the search box on).
    search_fields = ("routing_key",)
    search_help_text = _("A message id, or the beginning of a routing key (case-sensitive).")
    # Counting a large table twice (filtered and total) is the slow part of a changelist;
    # the paginator's count is the planner's estimate on a big table.
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 100
    # Only orderings an index serves (pgmb_message_created): any other sorts the table.
    sortable_by = ("created_time",)
    fields = (
        "id",
        "routing_key",
        "created_time",
        "available_time",
        "is_routed",
        "pretty_body",
        "pretty_headers",
        # The message options (docs/ordering.md).
        "priority",
        "group_key",
        "depends_on",
        "dedup_id",
        "max_retries",
        "retry_delay",
        "unique_key",
        "on_duplicate",
    )
    readonly_fields = fields
    inlines = (DeliveryInline, DeadLetterInline, AttemptInline)
    actions = replay.ACTIONS

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # The body and headers are never parsed by the JSON field (json.loads recurses: a
        # body stored nested thousands deep raised RecursionError): the list does not show
        # them, the message's page reads them as text (_stored_json).
        # The times are read as text where no datetime holds them (_with_times).
        return _with_times(super().get_queryset(request).defer("body", "headers"))

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        cl = super().get_changelist_instance(request)
        # The page's "routed" flags in one query of index probes, after its rows: as a
        # column of the list's query, PostgreSQL may hash a whole table for the EXISTS.
        # An action's POST redirects or shows its own page: the rows are not shown.
        if request.method != "POST":
            _hang_routed(list(cl.result_list), using=cl.queryset.db)
        return cl

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        refuse_unpermitted(self, request, replay.ACTIONS)
        return super().changelist_view(request, extra_context)

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return replay.can_replay(request)

    @admin.action(
        permissions=["replay"],
        description=_("Replay selected messages to the queues that acknowledged them"),
    )
    def replay_messages(
        self, request: HttpRequest, queryset: QuerySet[Message]
    ) -> TemplateResponse | None:
        return replay.replay_messages(self, request, queryset)

    @admin.display(boolean=True, description=_("routed"))
    def is_routed(self, obj: Message) -> bool:
        if not hasattr(obj, ROUTED):  # the message's own page
            _hang_routed([obj], using=obj._state.db)
        routed: bool = getattr(obj, ROUTED)
        return routed

    @admin.display(description=_("body"))
    def pretty_body(self, obj: Message) -> SafeString:
        return pretty_stored(_stored_json(obj)[0])

    @admin.display(description=_("headers"))
    def pretty_headers(self, obj: Message) -> SafeString:
        return pretty_stored(_stored_json(obj)[1])


_STORED = "pgmb_stored_json"


def _texts_kept(
    obj: Message | Delivery | DeadLetter, message_id: uuid.UUID
) -> tuple[str, str] | None:
    """The body and headers of a message (None: purged), in one query, kept on obj."""
    if not hasattr(obj, _STORED):
        setattr(obj, _STORED, stored_texts(message_id, obj._state.db))
    stored: tuple[str, str] | None = getattr(obj, _STORED)
    return stored


def _stored_json(obj: Message) -> tuple[str, str]:
    """The message's body and headers as PostgreSQL prints them."""
    return _texts_kept(obj, obj.pk) or ("null", "null")


def _hang_routed(messages: list[Message], using: str | None) -> None:
    """Set each message's "routed" flag: one query, an index probe or three per message."""
    if not messages:
        return
    lost = set(publish.unrouted([m.pk for m in messages], using=using))
    for message in messages:
        setattr(message, ROUTED, message.pk not in lost)


class _ByMessageAdmin(MessageSearchMixin, ReadOnlyMixin, admin.ModelAdmin):
    """Lists of rows that belong to a message and a queue (search: a message id, or the
    beginning of the message's routing key)."""

    # Searched by MessageSearchMixin (search_fields only turns the search box on).
    search_fields = ("message__routing_key",)
    search_help_text = _("A message id, or the beginning of a routing key (case-sensitive).")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 100

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(routing_key=routing_key_of())

    @admin.display(description=_("message"))
    def message_ref(self, obj: _ByMessageRow) -> SafeString:
        return message_link(obj.message_id, obj.routing_key)


class _MessagePage(_ColumnsBase):
    """The page of a delivery or a dead letter: its queue and worker by name, and its
    message (routing key, body, headers) with every attempt on that queue."""

    @admin.display(description=_("queue"))
    def queue_name(self, obj: Delivery | DeadLetter) -> str:
        return obj.queue.name

    @admin.display(description=_("worker"))
    def worker_name(self, obj: Delivery | DeadLetter) -> StrOrPromise:
        worker = obj.queue.worker
        return _("none (a pull queue)") if worker is None else worker.name

    @admin.display(description=_("message"))
    def message_page_ref(self, obj: Delivery | DeadLetter) -> SafeString:
        stored = Message.objects.using(obj._state.db).filter(pk=obj.message_id)
        return message_link(obj.message_id, stored.values_list("routing_key", flat=True).first())

    @admin.display(description=_("body"))
    def body(self, obj: Delivery | DeadLetter) -> SafeString | str:
        stored = _texts_kept(obj, obj.message_id)
        return "-" if stored is None else pretty_stored(stored[0])

    @admin.display(description=_("headers"))
    def headers(self, obj: Delivery | DeadLetter) -> SafeString | str:
        stored = _texts_kept(obj, obj.message_id)
        return "-" if stored is None else pretty_stored(stored[1])

    @admin.display(description=_("attempts on this queue"))
    def timeline(self, obj: Delivery | DeadLetter) -> SafeString:
        return attempt_timeline(obj.message_id, obj.queue_id, obj._state.db)


@admin.register(Delivery)
class DeliveryAdmin(_MessagePage, _TimeColumns, _ByMessageAdmin):
    # What fits a 1,280 pixel screen (tests/browser/test_list_widths.py) beside the
    # actions' checkboxes; the priority, group and attempts are on the delivery's page.
    list_display = (
        "id",
        "message_ref",
        "queue",
        "status",
        "available_time",
        "created_time",
    )
    list_filter = (
        filters.DeliveryStatusFilter,
        filters.DeliveryQueueFilter,
        filters.DeliveryWorkerFilter,
    )
    list_select_related = ("queue",)
    # Oldest first, the head of the backlog: the primary key's order. By due time it would
    # need an index of every delivery by available_at, which every publish, claim and
    # retry would pay for (docs/decisions/0017-admin-lists-read-through-indexes.md).
    ordering = ("id",)
    sortable_by = ("id",)
    fields = (
        "queue_name",
        "worker_name",
        "message_page_ref",
        "status",
        "priority",
        "group_key",
        # Unique while live (docs/publishing.md): the key it holds on its queue.
        "unique_key",
        "attempts",
        "last_status",
        "last_error",
        "available_time",
        "created_time",
        "body",
        "headers",
        "timeline",
    )
    readonly_fields = fields
    # The page's "Cancel" and "Run now" buttons post the list's actions for this delivery.
    change_form_template = "admin/pgmb/delivery_change_form.html"
    actions = ("cancel_selected", "run_now_selected")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return _with_times(super().get_queryset(request))

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        refuse_unpermitted(self, request, ["cancel_selected", "run_now_selected"])
        return super().changelist_view(request, extra_context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        delivery = self.get_object(request, object_id)
        live = delivery is not None and delivery.canceled_at is None
        # A leased one is running already.
        leased = delivery is not None and delivery.state == Delivery.State.LEASED
        extra = {
            **(extra_context or {}),
            "can_cancel": live and live_deliveries.can_cancel(request),
            "can_run": live and not leased and live_deliveries.can_run(request),
        }
        return super().change_view(request, object_id, form_url, extra)

    @admin.display(description=_("status"))
    def status(self, obj: Delivery) -> str:
        return _status(obj)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return live_deliveries.can_cancel(request)

    def has_run_permission(self, request: HttpRequest) -> bool:
        return live_deliveries.can_run(request)

    @admin.action(permissions=["cancel"], description=_("Cancel selected deliveries"))
    def cancel_selected(
        self, request: HttpRequest, queryset: QuerySet[Delivery]
    ) -> TemplateResponse | None:
        return live_deliveries.cancel_selected(self, request, queryset)

    @admin.action(permissions=["run"], description=_("Make selected deliveries due now"))
    def run_now_selected(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        live_deliveries.run_now_selected(self, request, queryset)


@admin.register(DeadLetter)
class DeadLetterAdmin(_MessagePage, _ByMessageAdmin):
    list_display = (
        "id",
        "message_ref",
        "queue",
        "attempts",
        "last_status",
        "short_error",
        "created_at",
    )
    fields = (
        "queue_name",
        "worker_name",
        "message_page_ref",
        "attempts",
        "last_status",
        "last_error",
        "created_at",
        "body",
        "headers",
        "timeline",
    )
    readonly_fields = fields
    # The page's "Requeue" button posts the list's action for this one dead letter.
    change_form_template = "admin/pgmb/dead_letter_change_form.html"
    list_filter = (
        filters.QueueFilter,
        filters.WorkerFilter,
        filters.DeadLetterStatusFilter,
        "created_at",
    )
    list_select_related = ("queue",)
    ordering = ("-created_at", "-id")
    sortable_by = ("id", "created_at")
    actions = ("requeue_selected", "requeue_queues", "purge_selected")

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        refuse_unpermitted(self, request, ["requeue_selected", "requeue_queues", "purge_selected"])
        return super().changelist_view(request, extra_context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        extra = {**(extra_context or {}), "can_requeue": dead_letters.can_requeue(request)}
        return super().change_view(request, object_id, form_url, extra)

    @admin.display(description=_("last error"))
    def short_error(self, obj: DeadLetter) -> SafeString | str:
        """The error's first line, cut to fit the list; the whole of it on the page."""
        error = obj.last_error or ""
        line = error.splitlines()[0] if error else ""
        if len(line) <= SHORT_ERROR and line == error:
            return error
        return format_html('<span title="{}">{}…</span>', error, line[:SHORT_ERROR])

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return dead_letters.can_requeue(request)

    def has_purge_permission(self, request: HttpRequest) -> bool:
        return dead_letters.can_purge(request)

    @admin.action(permissions=["requeue"], description=_("Requeue selected dead letters"))
    def requeue_selected(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> None:
        dead_letters.requeue_selected(self, request, queryset)

    @admin.action(
        permissions=["requeue"],
        description=_("Requeue every dead letter of the selected letters' queues"),
    )
    def requeue_queues(
        self, request: HttpRequest, queryset: QuerySet[DeadLetter]
    ) -> TemplateResponse | None:
        return dead_letters.requeue_queues(
            self,
            request,
            Queue.objects.filter(pk__in=queryset.order_by().values("queue")),
            action="requeue_queues",
            selected=queryset.order_by("pk").values_list("pk", flat=True),
        )

    @admin.action(permissions=["purge"], description=_("Purge selected dead letters"))
    def purge_selected(
        self, request: HttpRequest, queryset: QuerySet[DeadLetter]
    ) -> TemplateResponse | None:
        return dead_letters.purge_selected(self, request, queryset)


@admin.register(Attempt)
class AttemptAdmin(_AttemptColumns, _ByMessageAdmin):
    list_display = (
        "id",
        "message_ref",
        "queue_name",
        "attempt",
        "outcome",
        "status_code",
        "duration",
        "created_at",
    )
    list_filter = (
        "outcome",
        filters.AttemptQueueFilter,
        filters.AttemptWorkerFilter,
        filters.AttemptStatusFilter,
        "created_at",
    )
    ordering = ("-created_at", "-id")
    sortable_by = ("created_at",)
