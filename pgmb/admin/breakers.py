"""The circuit breakers of workers in the admin: their state, and closing them by hand.

A worker's breaker (off unless ``breaker_failures`` or ``breaker_rate`` is set) is shown in
the worker list, its change form and the dashboard as a badge: *closed*, *open* (until the
end of its cool-down; claims skip the worker) or *half-open* (one delivery probes the
endpoint), its reason as the badge's title. The state is read from the worker's row: no
query of its own. *Close the breakers of the selected workers* (granted by
``pgmb.pause_worker``, as resuming is) closes them at once, with one call of
``pgmb.breaker_reset``, and records a ``LogEntry`` for each worker it closed.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import DatabaseError, router, transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from .. import breakers
from ..models import Worker
from . import common
from .common import user_id

if TYPE_CHECKING:
    from django.contrib import admin

ACTIONS = ("close_breakers",)

LABELS = {
    "off": gettext_lazy("off"),
    "closed": gettext_lazy("closed"),
    "open": gettext_lazy("open"),
    "half_open": gettext_lazy("half-open"),
}
_TONES = {"off": "quiet", "closed": "good", "open": "bad", "half_open": "held"}


def state_of(worker: Worker) -> str:
    """off, closed, open or half_open."""
    if not worker.breaker_failures and worker.breaker_rate is None:
        return "off"
    return str(worker.breaker_state)


def describe(state: str, reason: str, until: datetime | None) -> str:
    """What the badge's title says: why it is in this state, and until when."""
    if state == "off":
        return _("No circuit breaker: set failures in a row or a failure rate to have one.")
    if state == "open" and until is not None:
        seconds = max(0.0, (until - timezone.now()).total_seconds())
        return _("%(reason)s; next probe in %(seconds)d s") % {
            "reason": reason,
            "seconds": round(seconds),
        }
    return reason


def badge(state: str, reason: str = "", until: datetime | None = None) -> SafeString:
    """A breaker's state as a small coloured label, its reason as the title."""
    return common.badge(
        "breaker", state, LABELS[state], _TONES[state], describe(state, reason, until)
    )


def worker_badge(worker: Worker) -> SafeString:
    return badge(state_of(worker), worker.breaker_reason, worker.breaker_until)


def close(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Worker]
) -> None:
    """Close the breakers of the selected workers; report "Closed the breakers of 2
    workers; 1 was not open."."""
    using = router.db_for_write(Worker) or "default"
    try:
        with transaction.atomic(using=using):
            # Locked as read: a transition cannot slip in between (pgmb.breaker_reset locks
            # them in the same order).
            rows = list(
                Worker.objects.using(using)
                .select_for_update()
                .filter(pk__in=queryset.order_by().values("pk"))
                .only("pk", "name", "breaker_state")
                .order_by("pk")
            )
            closing = [row for row in rows if row.breaker_state != "closed"]
            closed = breakers.reset([row.pk for row in closing], using=using) if closing else 0
    except DatabaseError as exc:
        model_admin.message_user(
            request,
            _("Nothing changed: the database refused it (%(error)s).") % {"error": exc},
            messages.ERROR,
        )
        return
    if closing:
        LogEntry.objects.log_actions(
            user_id=user_id(request),
            queryset=closing,
            action_flag=CHANGE,
            change_message=_("Closed the circuit breaker from the list's action."),
        )
    text = ngettext(
        "Closed the circuit breaker of %(n)d worker",
        "Closed the circuit breakers of %(n)d workers",
        closed,
    ) % {"n": closed}
    unchanged = len(rows) - closed
    if unchanged:
        rest = ngettext("%(n)d was not open", "%(n)d were not open", unchanged)
        text = f"{text}; {rest % {'n': unchanged}}"
    model_admin.message_user(request, f"{text}.", messages.SUCCESS if closed else messages.WARNING)
