"""Cancelling live deliveries and making them due now from the admin.

As :mod:`pgmb.admin.dead_letters` does for dead letters: every change goes through
:mod:`pgmb.deliveries` (one call for the selection), each action is granted by a permission
of the Delivery model (``pgmb.cancel_delivery``, ``pgmb.run_delivery``), records a
``LogEntry`` per delivery it affected and reports with the messages framework. Cancelling
asks first, on the confirmation page the dead letters' actions use
(docs/decisions/0084-cancel-and-run-now.md).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.db import connections, router, transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from .. import deliveries
from ..models import Delivery
from .common import user_id
from .dead_letters import confirmation_page, confirmed, locked

if TYPE_CHECKING:
    from django.contrib import admin

CANCEL_PERMISSION = "pgmb.cancel_delivery"
RUN_PERMISSION = "pgmb.run_delivery"


def can_cancel(request: HttpRequest) -> bool:
    return request.user.has_perm(CANCEL_PERMISSION)


def can_run(request: HttpRequest) -> bool:
    return request.user.has_perm(RUN_PERMISSION)


def _deliveries(n: int) -> str:
    return ngettext("%(n)d delivery", "%(n)d deliveries", n) % {"n": n}


def _database() -> str:
    return router.db_for_write(Delivery) or "default"


def cancel_selected(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Delivery]
) -> TemplateResponse | None:
    """Ask, then cancel the selected deliveries: one call of the state machine."""
    if not confirmed(request):
        rows = list(queryset.select_related("queue").order_by("queue__name", "pk"))
        per_queue = Counter(row.queue.name for row in rows)
        return confirmation_page(
            model_admin,
            request,
            action="cancel_selected",
            title=_("Cancel deliveries"),
            question=_(
                "Cancel %(deliveries)s? They are never posted again; one whose request is in "
                "flight ends when its outcome comes, recorded as cancelled."
            )
            % {"deliveries": _deliveries(len(rows))},
            groups=[f"{name}: {_deliveries(n)}" for name, n in sorted(per_queue.items())],
            items=[_describe(row) for row in rows],
            items_title=_("Deliveries"),
            selected=[row.pk for row in rows],
            yes=_("Yes, cancel them"),
        )
    selected = queryset.count()
    using = _database()
    with transaction.atomic(using=using):
        rows = locked(queryset, using)
        done = deliveries.cancel([row.pk for row in rows], using=using)
    # Those ended now are deleted; those in flight are marked: logged as such.
    ended = [row for row in rows if row.state != Delivery.State.LEASED]
    marked = [row for row in rows if row.state == Delivery.State.LEASED and row.canceled_at is None]
    if ended:
        LogEntry.objects.log_actions(
            user_id=user_id(request),
            queryset=ended,
            action_flag=DELETION,
            change_message=_("Cancelled: deleted, never posted again."),
        )
    if marked:
        LogEntry.objects.log_actions(
            user_id=user_id(request),
            queryset=marked,
            action_flag=CHANGE,
            change_message=_("Cancelled in flight: ends when its request's outcome comes."),
        )
    text = _("Cancelled %(deliveries)s.") % {"deliveries": _deliveries(done.total)}
    if done.in_flight:
        text += " " + _(
            "%(n)d in flight: each ends when its request's outcome comes, recorded as cancelled."
        ) % {"n": done.in_flight}
    if done.total < selected:
        text += " " + _("The others had finished or were cancelled already.")
    model_admin.message_user(request, text, messages.SUCCESS if done.total else messages.WARNING)
    return None


def run_now_selected(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Delivery]
) -> None:
    """Make the selected deliveries due now: one call of the state machine."""
    selected = queryset.count()
    using = _database()
    with transaction.atomic(using=using):
        rows = locked(queryset, using)
        done = deliveries.run_now([row.pk for row in rows], using=using)
        # Which ones moved: those whose due time is now the transaction's.
        moved = list(
            Delivery.objects.using(using).filter(
                pk__in=[row.pk for row in rows], available_at=_transaction_now(using)
            )
        )
    if moved:
        LogEntry.objects.log_actions(
            user_id=user_id(request),
            queryset=moved,
            action_flag=CHANGE,
            change_message=_("Run now: due now."),
        )
    text = _("Made %(deliveries)s due now.") % {"deliveries": _deliveries(done.total)}
    if done.waiting:
        text += " " + _(
            "%(n)d waiting: each stays behind its group or dependencies until they settle."
        ) % {"n": done.waiting}
    if done.total < selected:
        text += " " + _("The others were due already, leased or finished.")
    model_admin.message_user(request, text, messages.SUCCESS if done.total else messages.WARNING)


def _transaction_now(using: str) -> Any:
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def _describe(row: Delivery) -> str:
    return _("delivery %(id)d of message %(message)s on %(queue)s: %(state)s") % {
        "id": row.pk,
        "message": row.message_id,
        "queue": row.queue.name,
        "state": row.state,
    }
