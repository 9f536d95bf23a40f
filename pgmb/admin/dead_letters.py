"""Requeueing and purging dead letters from the admin.

Every change goes through :mod:`pgmb.deliveries` (the state machine's typed API), never
through SQL or ORM writes of the admin's own: one call for a selection of dead letters,
one per queue for a whole queue. Each action is granted by a permission of the DeadLetter
model (``pgmb.requeue_deadletter``, ``pgmb.purge_deadletter``), records a ``LogEntry``
per dead letter or queue it affected, and reports with the messages framework. The
destructive or wide ones (purge, a whole queue) ask first, on a confirmation page that
posts the same action back with ``post=yes``, the way Django's "delete selected" does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.db import router, transaction
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from .. import deliveries
from ..models import DeadLetter, Delivery, Queue
from .common import user_id

if TYPE_CHECKING:
    from django.contrib import admin

REQUEUE_PERMISSION = "pgmb.requeue_deadletter"
PURGE_PERMISSION = "pgmb.purge_deadletter"
CONFIRMATION_TEMPLATE = "admin/pgmb/dead_letter_action_confirmation.html"
#: Dead letters listed one by one on a confirmation page; the rest are counted.
LISTED = 100
#: What an action locks before it acts: dead letters, or live deliveries (live_deliveries.py).
Row = TypeVar("Row", DeadLetter, Delivery)


def can_requeue(request: HttpRequest) -> bool:
    return request.user.has_perm(REQUEUE_PERMISSION)


def can_purge(request: HttpRequest) -> bool:
    return request.user.has_perm(PURGE_PERMISSION)


def confirmed(request: HttpRequest) -> bool:
    """Whether this POST is the "Yes" of a confirmation page."""
    return request.POST.get("post") == "yes"


def _dead_letters(n: int) -> str:
    return ngettext("%(n)d dead letter", "%(n)d dead letters", n) % {"n": n}


def _database() -> str:
    return router.db_for_write(DeadLetter) or "default"


def locked(queryset: QuerySet[Row], using: str) -> list[Row]:
    """The selected dead letters (or live deliveries) that still exist, locked until the
    transaction ends."""
    return list(
        queryset.model._default_manager.using(using)
        .select_for_update(of=("self",))
        .select_related("queue")
        .filter(pk__in=queryset.order_by().values("pk"))
        .order_by("pk")
    )


def confirmation_page(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    *,
    action: str,
    title: str,
    question: str,
    groups: Sequence[str],
    items: Sequence[str],
    selected: Iterable[Any],
    yes: str,
    items_title: str = "",
) -> TemplateResponse:
    """Ask before ``action``; "Yes" posts it again, for the same selection, with post=yes.

    ``items`` are listed under ``items_title`` (by default "Dead letters").
    """
    opts = model_admin.model._meta
    context = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "subtitle": None,
        "opts": opts,
        "question": question,
        "groups": groups,
        "items": items[:LISTED],
        "items_title": items_title or _("Dead letters"),
        "more": max(len(items) - LISTED, 0),
        "action": action,
        "selected": [str(pk) for pk in selected],
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "yes": yes,
        "back_url": request.get_full_path(),
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, CONFIRMATION_TEMPLATE, context)


def requeue_selected(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[DeadLetter]
) -> None:
    """Requeue the selected dead letters: one call of the state machine for all of them."""
    using = _database()
    with transaction.atomic(using=using):
        rows = locked(queryset, using)
        n = deliveries.requeue([row.pk for row in rows], using=using) if rows else 0
    if rows:
        LogEntry.objects.log_actions(
            user_id=user_id(request),
            queryset=rows,
            action_flag=CHANGE,
            change_message=_("Requeued: due again on its queue, attempts from 0."),
        )
    text = _("Requeued %(dead_letters)s.") % {"dead_letters": _dead_letters(n)}
    if len(rows) > n:
        text += " " + _(
            "%(n)d of the selected were already live on their queue and left the dead letters."
        ) % {"n": len(rows) - n}
    model_admin.message_user(request, text, messages.SUCCESS if n else messages.WARNING)


def purge_selected(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[DeadLetter]
) -> TemplateResponse | None:
    """Ask, then delete the selected dead letters (their messages and attempts stay)."""
    if not confirmed(request):
        rows = list(queryset.select_related("queue").order_by("queue__name", "pk"))
        per_queue = Counter(row.queue.name for row in rows)
        return confirmation_page(
            model_admin,
            request,
            action="purge_selected",
            title=_("Purge dead letters"),
            question=_(
                "Delete %(dead_letters)s for good? Their messages and attempt history stay, "
                "but they can no longer be requeued."
            )
            % {"dead_letters": _dead_letters(len(rows))},
            groups=[f"{name}: {_dead_letters(n)}" for name, n in sorted(per_queue.items())],
            items=[_describe(row) for row in rows],
            selected=[row.pk for row in rows],
            yes=_("Yes, purge them"),
        )
    using = _database()
    with transaction.atomic(using=using):
        rows = locked(queryset, using)
        n = deliveries.purge_dead_letters([row.pk for row in rows], using=using) if rows else 0
    if rows:
        LogEntry.objects.log_actions(
            user_id=user_id(request),
            queryset=rows,
            action_flag=DELETION,
            change_message=_("Purged: the dead letter was deleted."),
        )
    model_admin.message_user(
        request,
        _("Purged %(dead_letters)s.") % {"dead_letters": _dead_letters(n)},
        messages.SUCCESS if n else messages.WARNING,
    )
    return None


def requeue_queues(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    queues: QuerySet[Queue],
    *,
    action: str,
    selected: Iterable[Any],
) -> TemplateResponse | None:
    """Ask, then requeue every dead letter of ``queues`` (one call per queue).

    ``selected`` are the primary keys the confirmation page posts back (the queues, or the
    dead letters they were chosen through).
    """
    queues = Queue.objects.filter(pk__in=queues.order_by().values("pk")).order_by("name")
    if not confirmed(request):
        counts = _counts(queues)
        total = sum(counts.values())
        return confirmation_page(
            model_admin,
            request,
            action=action,
            title=_("Requeue every dead letter of these queues"),
            question=ngettext(
                "Requeue all %(dead_letters)s of %(n)d queue? They become due now, their "
                "attempts counted from 0.",
                "Requeue all %(dead_letters)s of %(n)d queues? They become due now, their "
                "attempts counted from 0.",
                len(counts),
            )
            % {"dead_letters": _dead_letters(total), "n": len(counts)},
            groups=[f"{name}: {_dead_letters(n)}" for name, n in counts.items()],
            items=[],
            selected=selected,
            yes=_("Yes, requeue them"),
        )
    using = _database()
    done: list[tuple[Queue, int]] = []
    with transaction.atomic(using=using):
        for queue in queues:
            done.append((queue, deliveries.requeue_queue(queue.name, using=using)))
    for queue, n in done:
        model_admin.log_change(
            request,
            queue,
            _("Requeued every dead letter of the queue: %(dead_letters)s.")
            % {"dead_letters": _dead_letters(n)},
        )
    total = sum(n for _queue, n in done)
    model_admin.message_user(
        request,
        _("Requeued %(dead_letters)s of %(queues)s.")
        % {
            "dead_letters": _dead_letters(total),
            "queues": ", ".join(queue.name for queue, _n in done) or "-",
        },
        messages.SUCCESS if total else messages.WARNING,
    )
    return None


def _counts(queues: QuerySet[Queue]) -> dict[str, int]:
    """{queue name: how many dead letters it holds}, in one query."""
    return dict(queues.annotate(n=Count("dead_letters")).values_list("name", "n"))


def _describe(row: DeadLetter) -> str:
    status = "-" if row.last_status is None else str(row.last_status)
    return _(
        "message %(message)s on %(queue)s: %(attempts)d attempts, last status %(status)s"
    ) % {"message": row.message_id, "queue": row.queue.name, "attempts": row.attempts,
         "status": status}  # fmt: skip
