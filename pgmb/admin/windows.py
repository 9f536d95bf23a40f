"""Backfill… and Recover…, a queue's actions over a window of time, from the admin.

Backfill gives the selected queues the stored messages of the window that their bindings
match and that they never had (:func:`pgmb.deliveries.backfill`); Recover requeues their
dead letters that died in the window (:func:`pgmb.deliveries.recover`). Each is granted by
a permission of the Queue model (``pgmb.backfill_queue``, ``pgmb.recover_queue``), checked
on every POST (an action the user is not offered is refused, 403). The first POST shows a
small form for the window; its "Run" POST runs the action for every selected queue in one
transaction (a refusal, such as a window that ends before it starts, changes nothing),
records a ``LogEntry`` per queue, and says the counts.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import DatabaseError, router, transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from .. import deliveries
from ..db.error_text import database_reason
from ..models import Queue
from .common import user_id

if TYPE_CHECKING:
    from django.contrib import admin

BACKFILL_PERMISSION = "pgmb.backfill_queue"
RECOVER_PERMISSION = "pgmb.recover_queue"
ACTIONS = ("backfill_queues", "recover_queues")
TEMPLATE = "admin/pgmb/queue_window_action.html"


def can_backfill(request: HttpRequest) -> bool:
    return request.user.has_perm(BACKFILL_PERMISSION)


def can_recover(request: HttpRequest) -> bool:
    return request.user.has_perm(RECOVER_PERMISSION)


class WindowForm(forms.Form):
    """The window (since to before until) and how many a queue gets at most."""

    since = forms.DateTimeField(
        label=gettext_lazy("Since"), help_text=gettext_lazy("YYYY-MM-DD HH:MM, server time.")
    )
    until = forms.DateTimeField(
        label=gettext_lazy("Until"), help_text=gettext_lazy("Excluded. YYYY-MM-DD HH:MM.")
    )
    limit = forms.IntegerField(
        label=gettext_lazy("At most"),
        min_value=1,
        max_value=1_000_000,
        initial=deliveries.WINDOW_LIMIT,
        help_text=gettext_lazy("Per queue; run it again for more."),
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        since, until = data.get("since"), data.get("until")
        if since is not None and until is not None and until < since:
            raise forms.ValidationError(_("The window ends before it starts: until < since."))
        return data


def _initial() -> dict[str, Any]:
    now = timezone.localtime().replace(second=0, microsecond=0)
    return {"since": now - timedelta(days=1), "until": now + timedelta(minutes=1)}


def _run_window(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    queryset: QuerySet[Queue],
    *,
    action: str,
    title: str,
    question: str,
    yes: str,
    call: Callable[[str, datetime, datetime, int, str], int],
    done: Callable[[int], str],
    logged: str,
) -> TemplateResponse | None:
    queues = list(queryset.order_by("name"))
    form = WindowForm(request.POST) if request.POST.get("post") == "yes" else None
    if form is not None and form.is_valid():
        since, until, limit = (form.cleaned_data[k] for k in ("since", "until", "limit"))
        using = router.db_for_write(Queue) or "default"
        try:
            with transaction.atomic(using=using):
                counts = {q.name: call(q.name, since, until, limit, using) for q in queues}
        except DatabaseError as exc:
            model_admin.message_user(
                request,
                _("Nothing changed: %(reason)s") % {"reason": database_reason(exc)},
                messages.ERROR,
            )
            return None
        if queues:
            LogEntry.objects.log_actions(
                user_id=user_id(request),
                queryset=queues,
                action_flag=CHANGE,
                change_message=logged % {"since": since.isoformat(), "until": until.isoformat()},
            )
        summary = ", ".join(f"{name}: {n}" for name, n in counts.items())
        total = sum(counts.values())
        model_admin.message_user(
            request,
            done(total) % {"total": total, "summary": summary},
            messages.SUCCESS if total else messages.WARNING,
        )
        return None
    context = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "subtitle": None,
        "opts": model_admin.model._meta,
        "question": question,
        "names": [q.name for q in queues],
        "form": form or WindowForm(initial=_initial()),
        "action": action,
        "selected": [str(q.pk) for q in queues],
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "yes": yes,
        "back_url": request.get_full_path(),
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, TEMPLATE, context)


def _backfill(queue: str, since: datetime, until: datetime, limit: int, using: str) -> int:
    return deliveries.backfill(queue, since, until, limit, using=using)


def _recover(queue: str, since: datetime, until: datetime, limit: int, using: str) -> int:
    return deliveries.recover(queue, since, until, limit, using=using)


def backfill_queues(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Queue]
) -> TemplateResponse | None:
    return _run_window(
        model_admin,
        request,
        queryset,
        action="backfill_queues",
        title=_("Backfill queues"),
        question=_(
            "Give these queues the stored messages of the window that their bindings match "
            "and that they never had (published before each queue was made)? Their workers "
            "receive them, due now, oldest first."
        ),
        yes=_("Backfill"),
        call=_backfill,
        done=lambda n: ngettext(
            "Backfilled %(total)d message (%(summary)s).",
            "Backfilled %(total)d messages (%(summary)s).",
            n,
        ),
        logged=_("Backfilled messages published from %(since)s to %(until)s."),
    )


def recover_queues(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Queue]
) -> TemplateResponse | None:
    return _run_window(
        model_admin,
        request,
        queryset,
        action="recover_queues",
        title=_("Recover queues"),
        question=_(
            "Requeue the dead letters of these queues that died in the window? Their "
            "attempts start again, due now."
        ),
        yes=_("Recover"),
        call=_recover,
        done=lambda n: ngettext(
            "Recovered %(total)d dead letter (%(summary)s).",
            "Recovered %(total)d dead letters (%(summary)s).",
            n,
        ),
        logged=_("Recovered the dead letters that died from %(since)s to %(until)s."),
    )
