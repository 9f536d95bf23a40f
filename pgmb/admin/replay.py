"""Replaying delivered messages from the admin.

The action sends the selected messages again to the queues that acknowledged them, through
:func:`pgmb.deliveries.replay` (one call of ``pgmb.replay`` for the whole selection). It is
granted by the Message model's permission ``pgmb.replay_message``, asks first (it re-sends
to live endpoints), records a ``LogEntry`` per message and reports how many deliveries it
created.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import router, transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from .. import deliveries
from ..models import Attempt, DeadLetter, Delivery, Message
from .common import user_id
from .dead_letters import confirmation_page, confirmed

if TYPE_CHECKING:
    from django.contrib import admin

REPLAY_PERMISSION = "pgmb.replay_message"
ACTIONS = ("replay_messages",)


def can_replay(request: HttpRequest) -> bool:
    return request.user.has_perm(REPLAY_PERMISSION)


def _messages(n: int) -> str:
    return ngettext("%(n)d message", "%(n)d messages", n) % {"n": n}


def _deliveries(n: int) -> str:
    return ngettext("%(n)d delivery", "%(n)d deliveries", n) % {"n": n}


def replay_targets(message_ids: list[Any]) -> dict[Any, list[str]]:
    """{message id: the names of the queues it would be replayed to}, as pgmb.replay
    chooses them: queues that acked it, where it is neither live nor dead now."""
    acked = (
        Attempt.objects.filter(message_id__in=message_ids, outcome="ack")
        .values_list("message_id", "queue_id", "queue__name")
        .distinct()
    )
    busy = set(
        Delivery.objects.filter(message_id__in=message_ids).values_list("message_id", "queue_id")
    ) | set(
        DeadLetter.objects.filter(message_id__in=message_ids).values_list("message_id", "queue_id")
    )
    targets: dict[Any, list[str]] = defaultdict(list)
    for message_id, queue_id, name in acked:
        if (message_id, queue_id) not in busy:
            targets[message_id].append(name)
    return {k: sorted(v) for k, v in targets.items()}


def replay_messages(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Message]
) -> TemplateResponse | None:
    """Ask, then replay the selected messages to the queues that acknowledged them."""
    rows = list(queryset.order_by("created_at", "pk").only("pk", "routing_key"))
    ids = [row.pk for row in rows]
    if not confirmed(request):
        targets = replay_targets(ids)
        per_queue = Counter(name for names in targets.values() for name in names)
        total = sum(per_queue.values())
        items = [
            _("%(message)s (%(key)s): %(queues)s")
            % {
                "message": row.pk,
                "key": row.routing_key,
                "queues": ", ".join(targets.get(row.pk, [])) or _("nothing to replay"),
            }
            for row in rows
        ]
        return confirmation_page(
            model_admin,
            request,
            action="replay_messages",
            title=_("Replay messages"),
            question=_(
                "Replay %(messages)s? This creates %(deliveries)s, due now: the workers of "
                "these queues receive the messages again (attempts counted from 1). Queues "
                "where a message is live or dead right now are skipped."
            )
            % {"messages": _messages(len(rows)), "deliveries": _deliveries(total)},
            groups=[f"{name}: {_messages(n)}" for name, n in sorted(per_queue.items())],
            items=items,
            items_title=_("Messages"),
            selected=ids,
            yes=_("Yes, replay them"),
        )
    using = router.db_for_write(Message) or "default"
    with transaction.atomic(using=using):
        n = deliveries.replay(ids, using=using) if ids else 0
    if rows:
        LogEntry.objects.log_actions(
            user_id=user_id(request),
            queryset=rows,
            action_flag=CHANGE,
            change_message=_("Replayed to the queues that acknowledged it."),
        )
    model_admin.message_user(
        request,
        _("Replayed %(messages)s: %(deliveries)s created.")
        % {"messages": _messages(len(rows)), "deliveries": _deliveries(n)},
        messages.SUCCESS if n else messages.WARNING,
    )
    return None
