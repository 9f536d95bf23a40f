"""Workers and queues: the part of the broker an operator edits."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypedDict

from django import forms
from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.db.models import Count, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .. import fairness, metrics, routing
from ..endpoint_masking import mask_credentials
from ..metrics import QueueMetrics, WorkerMetrics
from ..models import Queue, Worker
from . import breakers, dead_letters, health, pausing, windows, worker_test
from .common import refuse_unpermitted, touches_hidden_field
from .fair_shares import URL_NAME as FAIR_SHARES_URL
from .fair_shares import FairSharesView
from .forms import WorkerForm
from .retiring_secrets import RetiringSecretInline

if TYPE_CHECKING:
    from django.contrib.admin.options import InlineModelAdmin, _FieldsetSpec
    from django_stubs_ext import StrOrPromise, WithAnnotations

    class _WorkerCounts(TypedDict):
        n_queues: int
        n_signing_secrets: int


class WorkerStateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin
    ) -> Iterable[tuple[str, StrOrPromise]]:
        return (("active", _("active")), ("paused", _("paused")))

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        if self.value() == "active":
            return queryset.filter(active=True)
        if self.value() == "paused":
            return queryset.filter(active=False)
        return None


class QueueStateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin
    ) -> Iterable[tuple[str, StrOrPromise]]:
        return (
            ("running", _("running")),
            ("paused", _("paused")),
            ("worker_paused", _("worker paused")),
        )

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        if self.value() == "running":
            return queryset.filter(Q(worker__active=True) | Q(worker=None), paused=False)
        if self.value() == "paused":
            return queryset.filter(paused=True)
        if self.value() == "worker_paused":
            return queryset.filter(paused=False, worker__active=False)
        return None


#: An endpoint with a user name or password: an "@" before the end of its host part.
CREDENTIALS_IN_URL = r"^[^:/?#]+://[^/?#]*@"


@admin.register(Worker)
class WorkerAdmin(health.MetricsColumnsMixin, admin.ModelAdmin):
    form = WorkerForm
    # What fits a 1,280 pixel screen (tests/browser/test_list_widths.py); the endpoint,
    # rate, timeout and signing are on the worker's page, the last success and the
    # failures in a row on the dashboard.
    list_display = (
        "name",
        "state",
        "breaker",
        "health",
        "requests_last_hour",
        "success_rate",
        "p95_latency",
        "last_error",
        "queue_count",
    )
    # The health columns: pgmb.worker_metrics() for the page's workers, one query.
    load_metrics = staticmethod(metrics.workers)
    metrics_name_field = "worker_name"
    health_fields = (
        "health",
        "requests_last_hour",
        "success_rate",
        "p95_latency",
        "last_success",
        "whole_last_error",
        "consecutive_failures",
        "queue_count",
    )
    list_filter = (WorkerStateFilter,)
    actions = (*pausing.WORKER_ACTIONS, *breakers.ACTIONS, worker_test.send_test_requests)
    # Searched by get_search_results: names, and endpoints where no credentials are.
    search_fields = ("name", "endpoint")
    readonly_fields = ("id", "created_at", "breaker", "breaker_since")
    #: What no URL parameter may filter on: a lookup on them (secret__startswith=...)
    #: would tell a guesser whether the guess is right, one request per character.
    #: (A lookup through the retiring secrets, retiring_secrets__secret, is refused too.)
    hidden_fields = ("secret", "endpoint")
    fieldsets = (
        (
            None,
            {"fields": ("name", "endpoint", "rps", "burst", "timeout", "max_in_flight", "active")},
        ),
        (_("Request signing"), {"fields": ("secret", "clear_secret")}),
        (
            _("Circuit breaker"),
            {
                "fields": (
                    "breaker",
                    "breaker_since",
                    "breaker_failures",
                    "breaker_rate",
                    "breaker_window",
                    "breaker_min_requests",
                    "breaker_cooldown",
                    "breaker_cooldown_max",
                ),
                "description": _(
                    "Pauses the worker by itself while its endpoint keeps failing (network "
                    "errors, timeouts, 5xx, 408, 429), and sends one delivery to probe it "
                    "after the cool-down. Off while both limits are empty."
                ),
            },
        ),
        (
            _("Answers that stop retries"),
            {
                "fields": ("dead_statuses", "retried_statuses"),
                "description": _(
                    "A failed delivery is retried until its queue's retries run out, unless "
                    "the worker answers with a status listed here (dead-lettered at once) or "
                    "with the header Pgmb-Delivery: abort."
                ),
            },
        ),
        (_("Record"), {"fields": ("id", "created_at"), "classes": ("collapse",)}),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Ordered again: a GROUP BY drops Meta.ordering, and the autocomplete's paginator
        # (a queue's worker field) needs an order.
        # Signed: by its secret or by a retiring one, as pgmb.signing_secrets() decides.
        signing = RawSQL(
            "cardinality(pgmb.signing_secrets(pgmb_worker.secret, pgmb_worker.id, now()))", ()
        )
        return (
            super()
            .get_queryset(request)
            .annotate(n_queues=Count("queues"), n_signing_secrets=signing)
            .order_by("name")
        )

    def get_fieldsets(self, request: HttpRequest, obj: Worker | None = None) -> _FieldsetSpec:
        fieldsets = super().get_fieldsets(request, obj)
        drop = set()
        shown_as: dict[str, str] = {}
        if obj is None or not obj.secret:
            # Without a stored secret WorkerForm has no "remove the secret" box.
            drop.add("clear_secret")
        if obj is not None and not self.has_change_permission(request, obj):
            # A read-only page shows every field's value: not the secret's, nor the
            # endpoint's credentials.
            drop.add("clear_secret")
            shown_as = {"secret": "secret_state", "endpoint": "masked_endpoint"}
        return tuple(
            (
                title,
                {
                    **opts,
                    "fields": tuple(
                        shown_as.get(f, f) if isinstance(f, str) else f
                        for f in opts["fields"]
                        if f not in drop
                    ),
                },
            )
            for title, opts in fieldsets
        )

    def get_inlines(self, request: HttpRequest, obj: Worker | None) -> list[type[InlineModelAdmin]]:
        # Only on the page of a worker with retiring secrets: the others' forms post no
        # formset (a row retired after the page was shown asks the editor to save again).
        if obj is not None and obj.retiring_secrets.exists():
            return [RetiringSecretInline]
        return []

    def get_readonly_fields(self, request: HttpRequest, obj: Worker | None = None) -> Any:
        return (*super().get_readonly_fields(request, obj), "secret_state", "masked_endpoint")

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        if touches_hidden_field(lookup, self.hidden_fields):
            return False
        return super().lookup_allowed(lookup, value, request)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        """Each word in a name, or in an endpoint without credentials: a search that looked
        into the user name or password of an endpoint would be a guessing oracle too."""
        found = queryset
        for word in search_term.split():
            found = found.filter(
                Q(name__icontains=word)
                | (Q(endpoint__icontains=word) & ~Q(endpoint__regex=CREDENTIALS_IN_URL))
            )
        return found, False

    @admin.display(description=_("endpoint"))
    def masked_endpoint(self, obj: Worker) -> str:
        return mask_credentials(obj.endpoint)

    @admin.display(description=_("secret"))
    def secret_state(self, obj: Worker) -> StrOrPromise:
        return _("set") if obj.secret else _("not set")

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        refuse_unpermitted(
            self, request, (*pausing.WORKER_ACTIONS, *breakers.ACTIONS, *worker_test.ACTIONS)
        )
        return super().changelist_view(request, extra_context)

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return pausing.can_pause_workers(request)

    def has_test_permission(self, request: HttpRequest) -> bool:
        return worker_test.can_test(request)

    @admin.action(permissions=["pause"], description=_("Pause selected workers"))
    def pause_workers(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        pausing.set_paused(self, request, queryset, True)

    @admin.action(permissions=["pause"], description=_("Resume selected workers"))
    def resume_workers(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        pausing.set_paused(self, request, queryset, False)

    @admin.action(
        permissions=["pause"], description=_("Close the circuit breakers of selected workers")
    )
    def close_breakers(self, request: HttpRequest, queryset: QuerySet[Worker]) -> None:
        breakers.close(self, request, queryset)

    @admin.display(description=_("breaker"), ordering="breaker_state")
    def breaker(self, obj: Worker) -> SafeString:
        return breakers.worker_badge(obj)

    @admin.display(description=_("state"), ordering="active")
    def state(self, obj: Worker) -> SafeString:
        state = pausing.worker_state(obj)
        title = _("Its queues are not dispatched.") if state == "paused" else ""
        return pausing.badge(state, title)

    @admin.display(description=_("health"))
    def health(self, obj: Worker) -> SafeString | str:
        figures: WorkerMetrics | None = health.figures_of(obj)
        if figures is None:
            return health.EMPTY
        return health.health_badge(health.worker_health(figures))

    @admin.display(description=_("requests (1 h)"))
    def requests_last_hour(self, obj: Worker) -> int | str:
        figures: WorkerMetrics | None = health.figures_of(obj)
        return health.EMPTY if figures is None else figures.requests_last_hour

    @admin.display(description=_("success (1 h)"))
    def success_rate(self, obj: Worker) -> str:
        figures: WorkerMetrics | None = health.figures_of(obj)
        return health.EMPTY if figures is None else health.percent(figures.success_rate)

    @admin.display(description=_("p95 (1 h)"))
    def p95_latency(self, obj: Worker) -> str:
        figures: WorkerMetrics | None = health.figures_of(obj)
        return health.EMPTY if figures is None else health.milliseconds(figures.p95_latency_ms)

    @admin.display(description=_("last success"))
    def last_success(self, obj: Worker) -> str:
        figures: WorkerMetrics | None = health.figures_of(obj)
        return health.EMPTY if figures is None else health.ago(figures.last_success_at)

    @admin.display(description=_("error (24 h)"))
    def last_error(self, obj: Worker) -> SafeString | str:
        figures: WorkerMetrics | None = health.figures_of(obj)
        return health.EMPTY if figures is None else health.error_text(figures)

    @admin.display(description=_("last error (24 h)"))
    def whole_last_error(self, obj: Worker) -> str:
        figures: WorkerMetrics | None = health.figures_of(obj)
        if figures is None or figures.last_error_at is None:
            return health.EMPTY
        return f"{health.error_line(figures)} ({health.ago(figures.last_error_at)})"

    @admin.display(description=_("failures in a row"))
    def consecutive_failures(self, obj: Worker) -> int | str:
        figures: WorkerMetrics | None = health.figures_of(obj)
        return health.EMPTY if figures is None else figures.consecutive_failures

    @admin.display(boolean=True, description=_("signed"))
    def signed(self, obj: WithAnnotations[Worker, _WorkerCounts]) -> bool:
        return obj.n_signing_secrets > 0

    @admin.display(description=_("queues"), ordering="n_queues")
    def queue_count(self, obj: WithAnnotations[Worker, _WorkerCounts]) -> SafeString:
        url = reverse("admin:pgmb_queue_changelist")
        return format_html('<a href="{}?worker__id__exact={}">{}</a>', url, obj.pk, obj.n_queues)


@admin.register(Queue)
class QueueAdmin(health.MetricsColumnsMixin, admin.ModelAdmin):
    # What fits a 1,280 pixel screen (tests/browser/test_list_widths.py); the worker (a
    # filter here), binding key and retries are on the queue's page, delayed, leased and
    # retrying on the dashboard.
    list_display = (
        "name",
        "state",
        "pending",
        "ready",
        "dead_letters",
        "oldest_due",
        "delivered_last_hour",
        "failed_last_hour",
    )
    # The health columns: pgmb.metrics_all() for the page's queues, one query.
    load_metrics = staticmethod(metrics.queues)
    metrics_name_field = "queue_name"
    health_fields = (
        "pending",
        "ready",
        "delayed",
        "leased",
        "retrying",
        "dead_letters",
        "oldest_due",
        "delivered_last_hour",
        "failed_last_hour",
    )
    list_filter = (QueueStateFilter, "worker")
    # The state column reads the worker's `active` from this join: no query per row.
    list_select_related = ("worker",)
    search_fields = ("name", "binding_key")
    # The queue's page links its Fair shares page (fair_shares.py) for those who may change it.
    change_form_template = "admin/pgmb/queue_change_form.html"
    readonly_fields = ("pattern", "sql_views", "fair_shares", "id", "created_at")
    actions = (*pausing.QUEUE_ACTIONS, "requeue_dead_letters", *windows.ACTIONS)
    fieldsets = (
        (None, {"fields": ("name", "binding_key", "pattern", "worker", "paused", "keep_history")}),
        (
            _("Retries"),
            {"fields": ("max_retries", "backoff_base", "backoff_max", "lease_seconds")},
        ),
        (
            _("Message options"),
            {"fields": ("dedup_window", "message_ttl", "on_expiry", "fair_shares")},
        ),
        (_("Monitoring"), {"fields": ("sql_views", "id", "created_at")}),
    )

    def get_urls(self) -> list[URLPattern]:
        # Before the admin's own: its "<object_id>/" would take this path too.
        view = self.admin_site.admin_view(self.fair_shares_view)
        return [
            path("<path:object_id>/fair-shares/", view, name=FAIR_SHARES_URL),
            *super().get_urls(),
        ]

    def fair_shares_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return FairSharesView(self, request, unquote(object_id)).respond()

    @admin.display(description=_("fair shares"))
    def fair_shares(self, obj: Queue) -> str:
        # Edited on the queue's Fair shares page (its button above the form).
        shares = fairness.shares(obj.name, using=obj._state.db) if obj.pk else None
        if shares is None or shares.header is None:
            return gettext("off: oldest first")
        keys = "; ".join(
            f"{k.key or '(none)'}: weight {k.weight}"
            + ("" if k.max_in_flight is None else f", {k.max_in_flight} in flight at most")
            + ("" if k.rps is None else f", {k.rps:g} rps")
            for k in shares.keys
        )
        return gettext("keys of header %(header)s in turn") % {"header": shares.header} + (
            f": {keys}" if keys else ""
        )

    def get_form(
        self, request: HttpRequest, obj: Queue | None = None, change: bool = False, **kwargs: Any
    ) -> type[forms.ModelForm]:
        form = super().get_form(request, obj, change=change, **kwargs)
        if obj is not None:
            queue_view, dead_view = obj.view_names
            hint = _(
                "Its SQL views are pgmb.%(queue)s and pgmb.%(dead)s; renaming the queue "
                "renames them."
            )
        else:
            queue_view, dead_view = Queue(name="order_queue").view_names
            hint = _(
                "Lower-case letters, digits and underscores. A queue named order_queue (or "
                "order) gets the SQL views pgmb.%(queue)s and pgmb.%(dead)s."
            )
        # A user who may only view the queue gets a form without fields (all read-only).
        if "name" in form.base_fields:
            form.base_fields["name"].help_text = hint % {"queue": queue_view, "dead": dead_view}
        return form

    @admin.display(description=_("pending"))
    def pending(self, obj: Queue) -> int | str:
        figures: QueueMetrics | None = health.figures_of(obj)
        return health.EMPTY if figures is None else figures.queue_length

    @admin.display(description=_("ready"))
    def ready(self, obj: Queue) -> int | str:
        figures: QueueMetrics | None = health.figures_of(obj)
        return health.EMPTY if figures is None else figures.queue_visible_length

    @admin.display(description=_("delayed"))
    def delayed(self, obj: Queue) -> int | str:
        figures: QueueMetrics | None = health.figures_of(obj)
        if figures is None:
            return health.EMPTY
        return figures.queue_length - figures.queue_visible_length - figures.leased

    @admin.display(description=_("leased"))
    def leased(self, obj: Queue) -> int | str:
        figures: QueueMetrics | None = health.figures_of(obj)
        return health.EMPTY if figures is None else figures.leased

    @admin.display(description=_("retrying"))
    def retrying(self, obj: Queue) -> int | str:
        figures: QueueMetrics | None = health.figures_of(obj)
        return health.EMPTY if figures is None else figures.retrying

    @admin.display(description=_("oldest due"))
    def oldest_due(self, obj: Queue) -> str:
        figures: QueueMetrics | None = health.figures_of(obj)
        return health.EMPTY if figures is None else health.age(figures.oldest_msg_age_sec)

    @admin.display(description=_("delivered (1 h)"))
    def delivered_last_hour(self, obj: Queue) -> int | str:
        figures: QueueMetrics | None = health.figures_of(obj)
        if figures is None:
            return health.EMPTY
        # Without history a delete leaves no row to count (the dashboard says so too).
        return figures.delivered_last_hour if figures.keeps_history else gettext("not kept")

    @admin.display(description=_("failed (1 h)"))
    def failed_last_hour(self, obj: Queue) -> int | str:
        figures: QueueMetrics | None = health.figures_of(obj)
        return health.EMPTY if figures is None else figures.failed_last_hour

    @admin.display(description=_("dead letters"))
    def dead_letters(self, obj: Queue) -> SafeString | int | str:
        figures: QueueMetrics | None = health.figures_of(obj)
        if figures is None:
            return health.EMPTY
        if not figures.dead_letters:
            return 0
        url = reverse("admin:pgmb_deadletter_changelist")
        return format_html(
            '<a href="{}?queue__id__exact={}">{}</a>', url, obj.pk, figures.dead_letters
        )

    @admin.display(description=_("SQL views"))
    def sql_views(self, obj: Queue) -> StrOrPromise:
        if obj._state.adding or not obj.name:
            return _("Created when the queue is saved.")
        queue_view, dead_view = routing.queue_view_names(obj.name)
        return format_html(
            "<code>SELECT * FROM pgmb.{} WHERE acknoledge = false;</code><br>"
            "<code>SELECT * FROM pgmb.{};</code>",
            queue_view,
            dead_view,
        )

    @admin.display(description=_("state"), ordering="paused")
    def state(self, obj: Queue) -> SafeString:
        state = pausing.queue_state(obj)
        titles: dict[str, StrOrPromise] = {
            "running": "",
            "paused": _("Its deliveries wait until the queue is resumed."),
            "worker paused": _("Its worker %(worker)s is paused: its deliveries wait.")
            % {"worker": obj.worker.name if obj.worker else ""},
        }
        return pausing.badge(state, titles[state])

    @admin.action(permissions=["pause"], description=_("Pause selected queues"))
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        pausing.set_paused(self, request, queryset, True)

    @admin.action(permissions=["pause"], description=_("Resume selected queues"))
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        pausing.set_paused(self, request, queryset, False)

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return pausing.can_pause_queues(request)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        refuse_unpermitted(
            self, request, [*pausing.QUEUE_ACTIONS, "requeue_dead_letters", *windows.ACTIONS]
        )
        return super().changelist_view(request, extra_context)

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return dead_letters.can_requeue(request)

    def has_backfill_permission(self, request: HttpRequest) -> bool:
        return windows.can_backfill(request)

    def has_recover_permission(self, request: HttpRequest) -> bool:
        return windows.can_recover(request)

    @admin.action(
        permissions=["backfill"], description=_("Backfill… (stored messages of a window)")
    )
    def backfill_queues(
        self, request: HttpRequest, queryset: QuerySet[Queue]
    ) -> TemplateResponse | None:
        return windows.backfill_queues(self, request, queryset)

    @admin.action(permissions=["recover"], description=_("Recover… (dead letters of a window)"))
    def recover_queues(
        self, request: HttpRequest, queryset: QuerySet[Queue]
    ) -> TemplateResponse | None:
        return windows.recover_queues(self, request, queryset)

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        # Through the worker: the same fields as WorkerAdmin hides.
        if touches_hidden_field(lookup, WorkerAdmin.hidden_fields):
            return False
        return super().lookup_allowed(lookup, value, request)

    @admin.action(
        permissions=["requeue"], description=_("Requeue all dead letters of the selected queues")
    )
    def requeue_dead_letters(
        self, request: HttpRequest, queryset: QuerySet[Queue]
    ) -> TemplateResponse | None:
        return dead_letters.requeue_queues(
            self,
            request,
            queryset,
            action="requeue_dead_letters",
            selected=queryset.order_by("name").values_list("pk", flat=True),
        )
