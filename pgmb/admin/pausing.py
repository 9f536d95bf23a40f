"""Pausing and resuming queues and workers from the admin.

A paused queue (``paused = true``) and an inactive worker (``active = false``) are skipped
by ``pgmb.claim``: their deliveries wait, nothing is lost. A paused schedule fires
nothing until resumed (its missed runs then follow its policy, docs/schedules.md). The
actions are granted by a permission of each model (``pgmb.pause_queue``,
``pgmb.pause_worker``, ``pgmb.pause_schedule``), not by "change". They ask nothing
(pausing is undone by resuming), change only the rows whose state differs, with one
UPDATE, record a ``LogEntry`` for each of those rows and report with the messages
framework how many changed and how many already were in that state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import DatabaseError, router, transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ..models import Queue, Schedule, Worker
from . import common
from .common import user_id

if TYPE_CHECKING:
    from django.contrib import admin
    from django_stubs_ext import StrOrPromise

PAUSE_QUEUE_PERMISSION = "pgmb.pause_queue"
PAUSE_WORKER_PERMISSION = "pgmb.pause_worker"
PAUSE_SCHEDULE_PERMISSION = "pgmb.pause_schedule"

QUEUE_ACTIONS = ("pause_queues", "resume_queues")
WORKER_ACTIONS = ("pause_workers", "resume_workers")
SCHEDULE_ACTIONS = ("pause_schedules", "resume_schedules")

#: The labels of the state columns.
STATE_LABELS = {
    "running": gettext_lazy("running"),
    "active": gettext_lazy("active"),
    "paused": gettext_lazy("paused"),
    "worker paused": gettext_lazy("worker paused"),
}
_TONES = {"running": "good", "active": "good", "paused": "held", "worker paused": "bad"}


def can_pause_queues(request: HttpRequest) -> bool:
    return request.user.has_perm(PAUSE_QUEUE_PERMISSION)


def can_pause_workers(request: HttpRequest) -> bool:
    return request.user.has_perm(PAUSE_WORKER_PERMISSION)


def can_pause_schedules(request: HttpRequest) -> bool:
    return request.user.has_perm(PAUSE_SCHEDULE_PERMISSION)


def badge(state: str, title: StrOrPromise = "") -> SafeString:
    """A queue's or worker's state as a small coloured label."""
    return common.badge("state", state, STATE_LABELS[state], _TONES[state], title)


def queue_state(queue: Queue) -> str:
    """running, paused, or worker paused (the queue runs but its worker is inactive); a
    pull queue (no worker) runs unless paused.

    ``queue.worker`` must be loaded with the queue (the changelist selects it related).
    """
    if queue.paused:
        return "paused"
    return "running" if queue.worker is None or queue.worker.active else "worker paused"


def worker_state(worker: Worker) -> str:
    return "active" if worker.active else "paused"


def _count(model: type[Queue | Worker | Schedule], n: int) -> str:
    if model is Queue:
        return ngettext("%(n)d queue", "%(n)d queues", n) % {"n": n}
    if model is Schedule:
        return ngettext("%(n)d schedule", "%(n)d schedules", n) % {"n": n}
    return ngettext("%(n)d worker", "%(n)d workers", n) % {"n": n}


def set_paused(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    queryset: QuerySet[Queue] | QuerySet[Worker] | QuerySet[Schedule],
    paused: bool,
) -> None:
    """Pause (or resume) the selected queues, workers or schedules; report "Paused 2
    queues; 1 was already paused."."""
    model = queryset.model
    if model is Queue or model is Schedule:
        done = _set(request, model, queryset, "paused", paused)
    else:
        done = _set(request, Worker, queryset, "active", not paused)
    if isinstance(done, DatabaseError):
        model_admin.message_user(
            request,
            _("Nothing changed: the database refused the update (%(error)s).") % {"error": done},
            messages.ERROR,
        )
        return
    changed, unchanged = done
    things = _count(model, changed)
    if paused:
        text = _("Paused %(things)s") % {"things": things}
        rest = ngettext("%(n)d was already paused", "%(n)d were already paused", unchanged)
    else:
        text = _("Resumed %(things)s") % {"things": things}
        rest = ngettext("%(n)d was not paused", "%(n)d were not paused", unchanged)
    if unchanged:
        text = f"{text}; {rest % {'n': unchanged}}"
    model_admin.message_user(request, f"{text}.", messages.SUCCESS if changed else messages.WARNING)


def _set(
    request: HttpRequest,
    model: type[Queue | Worker | Schedule],
    queryset: QuerySet,
    field: str,
    value: bool,
) -> tuple[int, int] | DatabaseError:
    """Set ``field`` to ``value`` on the selected rows that differ: (changed, unchanged).

    The selection is locked and read once (``SELECT … FOR UPDATE``, which also tells the
    rows that change from those already in that state), then the changing rows are updated
    by one UPDATE, whose row triggers (the worker's validation, the queue's preparation and
    views) run as for any other update, and logged with one bulk ``LogEntry`` insert. If the
    database refuses the UPDATE (a trigger, a lock timeout), nothing changed: the error is
    returned for the message.
    """
    using = router.db_for_write(model) or "default"
    try:
        with transaction.atomic(using=using):
            rows = list(
                model.objects.using(using)
                .select_for_update()
                .filter(pk__in=queryset.order_by().values("pk"))
                .only("pk", "name", field)
                .order_by("pk")
            )
            changing = [row for row in rows if getattr(row, field) != value]
            if changing:
                model.objects.using(using).filter(pk__in=[row.pk for row in changing]).update(
                    **{field: value}
                )
    except DatabaseError as exc:
        return exc
    if changing:
        paused = value if field == "paused" else not value
        LogEntry.objects.log_actions(
            user_id=user_id(request),
            queryset=changing,
            action_flag=CHANGE,
            change_message=_("Paused from the list's action.")
            if paused
            else _("Resumed from the list's action."),
        )
    return len(changing), len(rows) - len(changing)
