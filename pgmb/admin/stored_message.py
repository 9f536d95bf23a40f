"""What the pages of a message, a delivery and a dead letter show of the message: its body
and headers as stored, indented, and its attempts on a queue as a timeline."""

from __future__ import annotations

import json
import re
import uuid

from django.db.models import TextField
from django.db.models.functions import Cast
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from ..message_limits import MAX_DEPTH
from ..models import Attempt, Message
from .common import pretty_json

#: Characters of a body or headers a page shows; a longer one is cut there, as stored.
SHOWN_CHARACTERS = 64 * 1024

#: A JSON string (with its escapes), or anything but a bracket: what the depth scan skips.
_NOT_BRACKETS = re.compile(r'"(?:[^"\\]|\\.)*"|[^\[\]{}"]+')

_AS_STORED = '<pre class="pgmb-json" style="margin:0;white-space:pre-wrap">{}</pre>'


def stored_texts(message_id: uuid.UUID, using: str | None) -> tuple[str, str] | None:
    """The message's body and headers as PostgreSQL prints them (None: purged or archived).

    Never parsed by the JSON field: json.loads recurses, and a body stored nested thousands
    deep raised RecursionError."""
    return (
        Message.objects.using(using)
        .filter(pk=message_id)
        .values_list(Cast("body", TextField()), Cast("headers", TextField()))
        .first()
    )


def _json_depth(text: str) -> int:
    """How deep containers nest in a JSON text, counted without recursion."""
    depth = deepest = 0
    for bracket in _NOT_BRACKETS.sub("", text):
        if bracket in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def pretty_stored(text: str) -> SafeString:
    """Indented JSON. Shown as stored, with a note: a text longer than SHOWN_CHARACTERS (cut
    there: a page of megabytes helps nobody), or nested deeper than publishing allows (stored
    before the limit, or by the tables' owner; indenting it would recurse too deep)."""
    if len(text) > SHOWN_CHARACTERS:
        return format_html(
            '<p class="help">{}</p>' + _AS_STORED,
            _("The first %(shown)s of %(total)s characters, as stored.")
            % {"shown": f"{SHOWN_CHARACTERS:,}", "total": f"{len(text):,}"},
            text[:SHOWN_CHARACTERS],
        )
    if _json_depth(text) <= MAX_DEPTH:
        return pretty_json(json.loads(text))
    return format_html(
        '<p class="help">{}</p>' + _AS_STORED,
        _("Nested too deep to indent (more than %(depth)s levels): shown as stored.")
        % {"depth": MAX_DEPTH},
        text,
    )


def duration_text(duration_ms: float | None) -> str:
    return "-" if duration_ms is None else f"{duration_ms:.1f} ms"


def attempt_timeline(message_id: uuid.UUID, queue_id: uuid.UUID, using: str | None) -> SafeString:
    """Every attempt of the message on the queue, oldest first, as a table."""
    attempts = (
        Attempt.objects.using(using)
        .filter(message_id=message_id, queue_id=queue_id)
        .order_by("created_at", "id")
    )
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (
                a.attempt,
                a.get_outcome_display(),
                "" if a.status_code is None else a.status_code,
                duration_text(a.duration_ms),
                a.error,
                # To the millisecond: attempts a backoff apart can be within a minute.
                timezone.localtime(a.created_at).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
            )
            for a in attempts
        ),
    )
    if not rows:
        return format_html("<p>{}</p>", _("No attempt recorded."))
    return format_html(
        '<table class="pgmb-timeline"><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th>'
        "<th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
        _("attempt"),
        _("outcome"),
        _("status"),
        _("duration"),
        _("error"),
        _("time"),
        rows,
    )
