"""Pieces shared by pgmb's ModelAdmins."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.models import (
    BooleanField,
    F,
    Func,
    Model,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
)
from django.db.models.expressions import RawSQL
from django.db.models.sql.compiler import SQLCompiler
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timezone import now

from .. import sql
from ..models import Message, Queue

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    # What MessageSearchMixin is mixed into: its super() is a ModelAdmin's.
    _SearchBase = admin.ModelAdmin[Any]
else:
    _SearchBase = object

#: How many of the newest messages a question that only per-message probes can answer
#: looks among: the routing-key search of the delivery, dead-letter and attempt lists, and
#: the message list's "routed: No" (docs/decisions/0017-admin-lists-read-through-indexes.md).
MESSAGE_WINDOW = 10_000

#: Up to how many messages with a routing-key prefix are read through the key's index to
#: find the newest :data:`MESSAGE_WINDOW`; with more, the time index is walked instead,
#: through the newest :data:`WALK_AT_MOST` messages at most (a prefix of more than one
#: message in twenty fills the window within them, unless its messages are mostly older).
FEW_MATCHES = 3 * MESSAGE_WINDOW
WALK_AT_MOST = 20 * MESSAGE_WINDOW


class ReadOnlyMixin:
    """View-only in the admin: these rows change only through pgmb's SQL state machine."""

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


class ReadOnlyInline(ReadOnlyMixin, admin.TabularInline):
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False


class AnyOf(Func):
    """``column = ANY(ARRAY(subquery))``: the subquery runs once, then each of its values is
    looked up in the column's index.

    ``column IN (subquery)`` lets the planner choose a hash join instead, which reads the
    whole table of ``column`` whenever the subquery's rows are more than a few thousand.
    """

    output_field = BooleanField()

    def __init__(self, column: str, subquery: QuerySet[Any] | RawSQL) -> None:
        super().__init__(
            F(column), subquery if isinstance(subquery, RawSQL) else Subquery(subquery)
        )

    def as_sql(  # type: ignore[override]
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> tuple[str, tuple[Any, ...]]:
        column, subquery = self.get_source_expressions()
        column_sql, column_params = compiler.compile(column)
        subquery_sql, subquery_params = compiler.compile(subquery)
        # The subquery's SQL comes in parentheses: ARRAY(SELECT ...).
        return f"{column_sql} = ANY(ARRAY{subquery_sql})", (*column_params, *subquery_params)


class MessageSearchMixin(_SearchBase):
    """Search by message: a UUID is a message id (exact: the primary key, or the index of
    the message id), anything else the beginning of a routing key (case-sensitive, through
    the index pgmb_message_routing_key).

    On the lists of a message's rows (deliveries, dead letters, attempts) the key is the
    message's: the rows of the newest :data:`MESSAGE_WINDOW` messages whose key starts with
    the term, each looked up by message id. A join would let the planner read the whole
    table of rows when the key is frequent among messages but rare among those rows.
    """

    #: The field holding the message id on this admin's model.
    message_id_field = "message_id"

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            message_id = uuid.UUID(term)
        except ValueError:
            return queryset.filter(self.routing_key_prefix(term)), False
        return queryset.filter(**{self.message_id_field: message_id}), False

    def routing_key_prefix(self, prefix: str) -> Q | AnyOf:
        if self.message_id_field == "id":  # the messages themselves
            return Q(routing_key__startswith=prefix)
        return AnyOf(self.message_id_field, newest_with_key(prefix))


def newest_with_key(prefix: str) -> RawSQL:
    """The ids of the newest :data:`MESSAGE_WINDOW` messages whose routing key starts with
    ``prefix``: all messages are looked among when at most :data:`FEW_MATCHES` carry the
    prefix (read through the key's index), the newest :data:`WALK_AT_MOST` when more do
    (walked through the time index). Either way a bounded read, planned one way only
    (``admin.sql: newest_with_key``)."""
    pattern = connection.ops.prep_for_like_query(prefix) + "%"
    few, window = FEW_MATCHES, MESSAGE_WINDOW
    params = (pattern, few, few, window, WALK_AT_MOST, pattern, few, window)
    # A statement of pgmb's own; the search term is a parameter.
    return RawSQL(sql.query("admin.sql", "newest_with_key"), params)  # noqa: S611


def queue_name_of(field: str = "queue_id") -> Subquery:
    """The queue's name, without a join that would hide rows whose queue was deleted."""
    return Subquery(Queue.objects.filter(pk=OuterRef(field)).order_by().values("name")[:1])


def routing_key_of(field: str = "message_id") -> Subquery:
    """The message's routing key, without a join that would hide rows of purged messages."""
    return Subquery(Message.objects.filter(pk=OuterRef(field)).order_by().values("routing_key")[:1])


def message_link(message_id: uuid.UUID, routing_key: str | None) -> SafeString:
    """A link to the message, labelled with its routing key (no link once it was purged)."""
    if routing_key is None:
        return format_html("{} (message purged)", message_id)
    url = reverse("admin:pgmb_message_change", args=[message_id])
    return format_html('<a href="{}" title="{}">{}</a>', url, message_id, routing_key)


def pretty_json(value: Any) -> SafeString:
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return format_html(
        '<pre class="pgmb-json" style="margin:0;white-space:pre-wrap">{}</pre>', text
    )


def delivery_status(state: str, available_at: Any) -> str:
    """ready / delayed / leased / waiting, as in the SQL view pgmb.queue_entries.

    A lease that has run out is shown as ready: the delivery can be claimed again.
    """
    if state == "waiting":
        return "waiting"
    if available_at <= now():
        return "ready"
    return "leased" if state == "leased" else "delayed"


def refuse_unpermitted(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, actions: Iterable[str]
) -> None:
    """403 for a POST of one of ``actions`` that this user is not offered.

    Django would ignore it (or say "No action selected."); an explicit refusal is what an
    operator, and a test, can tell apart from "nothing to do".
    """
    if request.method != "POST":
        return
    action = request.POST.get("action")
    if action in set(actions) and action not in model_admin.get_actions(request):
        raise PermissionDenied


def touches_hidden_field(lookup: str, hidden: Iterable[str]) -> bool:
    """Whether a list's URL lookup (``secret__startswith``, ``worker__secret``) filters on
    one of the ``hidden`` fields: the admin answers those 400 (``lookup_allowed``)."""
    return any(part in set(hidden) for part in lookup.split("__"))


def user_id(request: HttpRequest) -> int:
    """The acting user's id, for ``LogEntry`` rows."""
    pk = request.user.pk
    if pk is None:  # the admin only runs actions for a logged-in staff user
        raise PermissionDenied
    return pk


#: Badge tones (background, text), one palette for every state the lists show.
_TONES = {
    "good": ("#dff0d8", "#2b542c"),
    "held": ("#fcf8e3", "#8a6d3b"),
    "bad": ("#f2dede", "#a94442"),
    "quiet": ("#eeeeee", "#555555"),
}


def badge(family: str, state: str, label: Any, tone: str, title: Any = "") -> SafeString:
    """A state as a small coloured label, class ``pgmb-<family> pgmb-<family>-<state>``
    (plain HTML and an inline style: no stylesheet, no script)."""
    background, colour = _TONES[tone]
    return format_html(
        '<span class="pgmb-{} pgmb-{}-{}" title="{}" style="display:inline-block;'
        "padding:1px 6px;border-radius:8px;font-size:0.85em;white-space:nowrap;"
        'background:{};color:{}">{}</span>',
        family,
        family,
        state.replace(" ", "-"),
        title,
        background,
        colour,
        label,
    )
