"""Messages, and what became of them: live deliveries, dead letters, the attempt log.

All of it is read-only here: rows move only through pgmb's SQL state machine. Dead letters
can be requeued and purged by actions (see :mod:`pgmb.admin.dead_letters`), and messages
replayed (see :mod:`pgmb.admin.replay`), which call it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypedDict

from django.contrib import admin
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import Attempt, DeadLetter, Delivery, Message, Queue
from . import dead_letters, replay
from .common import (
    MessageIdSearchMixin,
    ReadOnlyInline,
    ReadOnlyMixin,
    delivery_status,
    message_link,
    pretty_json,
    queue_name_of,
    refuse_unpermitted,
    routing_key_of,
)
from .paginator import EstimatedCountPaginator

if TYPE_CHECKING:
    from django.contrib.admin.options import BaseModelAdmin
    from django_stubs_ext import StrOrPromise, WithAnnotations

    class _QueueName(TypedDict):
        queue_name: str | None

    class _Routed(TypedDict):
        is_routed: bool

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


def _duration(obj: Attempt) -> str:
    return "-" if obj.duration_ms is None else f"{obj.duration_ms:.1f} ms"


def routed() -> ExpressionWrapper:
    """Whether a message reached any queue: the ``routed`` column of the view pgmb.messages.

    A routed message always has a live delivery, a dead letter or an attempt, whichever
    stage it is at; one with none of them matched no binding when it was published.
    """
    return ExpressionWrapper(
        Q(Exists(Delivery.objects.filter(message=OuterRef("pk"))))
        | Q(Exists(DeadLetter.objects.filter(message=OuterRef("pk"))))
        | Q(Exists(Attempt.objects.filter(message=OuterRef("pk")))),
        output_field=BooleanField(),
    )


class RoutedFilter(admin.SimpleListFilter):
    title = _("routed")
    parameter_name = "routed"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin
    ) -> Iterable[tuple[str, StrOrPromise]]:
        return (("yes", _("Yes")), ("no", _("No: matched no queue")))

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        if self.value() == "yes":
            return queryset.filter(is_routed=True)
        if self.value() == "no":
            return queryset.filter(is_routed=False)
        return None


class DeliveryInline(ReadOnlyInline):
    model = Delivery
    verbose_name_plural = _("live deliveries")
    fields = ("queue", "status", "attempts", "available_at", "created_at")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).select_related("queue")

    @admin.display(description=_("status"))
    def status(self, obj: Delivery) -> str:
        return delivery_status(obj.state, obj.available_at)


class DeadLetterInline(ReadOnlyInline):
    model = DeadLetter
    fields = ("queue", "attempts", "last_status", "last_error", "created_at")
    readonly_fields = fields

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
        return _duration(obj)


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
class MessageAdmin(MessageIdSearchMixin, ReadOnlyMixin, admin.ModelAdmin):
    message_id_field = "id"
    list_display = ("id", "routing_key", "created_at", "available_at", "is_routed")
    list_filter = (RoutedFilter,)
    search_fields = ("routing_key",)
    # Counting a large table twice (filtered and total) is the slow part of a changelist;
    # the paginator's count is the planner's estimate on a big table.
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 100
    fields = (
        "id",
        "routing_key",
        "created_at",
        "available_at",
        "is_routed",
        "pretty_body",
        "pretty_headers",
    )
    readonly_fields = fields
    inlines = (DeliveryInline, DeadLetterInline, AttemptInline)
    actions = replay.ACTIONS

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(is_routed=routed())

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

    @admin.display(boolean=True, description=_("routed"), ordering="is_routed")
    def is_routed(self, obj: WithAnnotations[Message, _Routed]) -> bool:
        return obj.is_routed

    @admin.display(description=_("body"))
    def pretty_body(self, obj: Message) -> SafeString:
        return pretty_json(obj.body)

    @admin.display(description=_("headers"))
    def pretty_headers(self, obj: Message) -> SafeString:
        return pretty_json(obj.headers)


class _ByMessageAdmin(MessageIdSearchMixin, ReadOnlyMixin, admin.ModelAdmin):
    """Lists of rows that belong to a message and a queue (search: a message id)."""

    search_fields = ("message__routing_key",)
    search_help_text = _("A message id, or part of a routing key.")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 100

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(routing_key=routing_key_of())

    @admin.display(description=_("message"))
    def message_ref(self, obj: _ByMessageRow) -> SafeString:
        return message_link(obj.message_id, obj.routing_key)


@admin.register(Delivery)
class DeliveryAdmin(_ByMessageAdmin):
    list_display = (
        "id",
        "message_ref",
        "queue",
        "status",
        "attempts",
        "available_at",
        "created_at",
    )
    list_filter = ("state", "queue")
    list_select_related = ("queue",)
    ordering = ("available_at", "id")

    @admin.display(description=_("status"), ordering="available_at")
    def status(self, obj: Delivery) -> str:
        return delivery_status(obj.state, obj.available_at)


@admin.register(DeadLetter)
class DeadLetterAdmin(_ByMessageAdmin):
    list_display = (
        "id",
        "message_ref",
        "queue",
        "attempts",
        "last_status",
        "last_error",
        "created_at",
    )
    list_filter = ("queue", "last_status")
    list_select_related = ("queue",)
    ordering = ("-created_at", "-id")
    actions = ("requeue_selected", "requeue_queues", "purge_selected")

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        refuse_unpermitted(self, request, ["requeue_selected", "requeue_queues", "purge_selected"])
        return super().changelist_view(request, extra_context)

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
    list_filter = ("outcome", "queue")
    ordering = ("-created_at", "-id")
