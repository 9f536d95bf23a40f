"""The admin's schedule form: a schedule is checked and written by ``pgmb.schedule`` (through
:func:`pgmb.schedules.schedule`), the one write path, never by a model save.

Each field's rule is the API's own function (the cron expression: ``check_cron``; the time
zone: ``time_zone``; the routing key: the routing rule), so its error shows next to the
field. Whatever else the write path refuses (an interval under a second, a body or headers
``pgmb.message_problem`` refuses, cron and every both given or neither) is found by a dry
run of the write in a savepoint rolled back at once: the form is refused with the database's
words and nothing is stored. The next due time is the write path's too: the form never
computes it (docs/decisions/0092-schedules-edited-in-the-admin.md).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db import router, transaction
from django.utils.translation import gettext_lazy as _

from .. import schedules
from ..errors import InvalidRoutingKey, InvalidSchedule
from ..models import Schedule, validate_routing_key


class _DryRun(Exception):
    """Rolls back the savepoint of a dry run that succeeded."""


def write(form_data: dict[str, Any], name: str, task: dict[str, Any] | None) -> int:
    """Create or change schedule ``name`` from a form's cleaned data through
    :func:`pgmb.schedules.schedule`; its id. ``task`` is kept as it is (a schedule made by
    :func:`pgmb.tasks.schedule_task` stays one)."""
    return schedules.schedule(
        name,
        form_data["routing_key"],
        form_data["body"],
        cron=form_data.get("cron") or None,
        every=form_data.get("every"),
        timezone=form_data["timezone"],
        headers=form_data.get("headers") or {},
        missed=form_data["missed"],
        task=task,
        using=router.db_for_write(Schedule),
    )


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = [
            "name",
            "cron",
            "every",
            "timezone",
            "missed",
            "routing_key",
            "body",
            "headers",
            "paused",
        ]
        widgets = {
            "name": forms.TextInput(attrs={"class": "vTextField"}),
            "cron": forms.TextInput(attrs={"class": "vTextField"}),
            "timezone": forms.TextInput(attrs={"class": "vTextField"}),
            "routing_key": forms.TextInput(attrs={"class": "vTextField"}),
            "body": forms.Textarea(attrs={"rows": 4, "class": "vLargeTextField"}),
            "headers": forms.Textarea(attrs={"rows": 2, "class": "vLargeTextField"}),
        }
        help_texts = {
            "cron": _(
                "5 fields: minute hour day-of-month month day-of-week (docs/schedules.md). "
                "Leave blank for an interval."
            ),
            "every": _(
                "An interval instead of a cron expression: seconds (10), or [DD] HH:MM:SS; "
                "at least 1 second."
            ),
            "timezone": _(
                "An IANA name (UTC, Europe/Berlin), in which the cron expression is read."
            ),
            "body": _("The message's body, JSON."),
            "headers": _("The message's headers, a JSON object."),
            "paused": _(
                "A paused schedule fires nothing; on resuming, missed runs follow the policy."
            ),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "body" in self.fields:
            # Any JSON value but null is a body: {} and [] too, which forms take for empty.
            self.fields["body"].empty_values = [None, ""]
            self.fields["body"].required = True
        if "headers" in self.fields:
            self.fields["headers"].required = False
        if "routing_key" in self.fields:
            self.fields["routing_key"].validators.append(validate_routing_key)

    def clean_cron(self) -> str | None:
        cron = self.cleaned_data.get("cron") or None
        if cron is not None:
            try:
                schedules.check_cron(cron)
            except InvalidSchedule as exc:
                raise ValidationError(str(exc), code="cron") from None
        return cron

    def clean_timezone(self) -> str:
        name: str = self.cleaned_data["timezone"]
        try:
            schedules.time_zone(name)
        except InvalidSchedule as exc:
            raise ValidationError(str(exc), code="timezone") from None
        return name

    def clean_headers(self) -> Any:
        headers = self.cleaned_data.get("headers")
        return {} if headers is None or headers == "" else headers

    def clean(self) -> dict[str, Any]:
        data = super().clean() or self.cleaned_data
        if self.errors:
            return data
        name = self.instance.name if self.instance.pk else data.get("name", "")
        try:
            with transaction.atomic(using=router.db_for_write(Schedule)):
                write(data, name, self.instance.task)
                raise _DryRun
        except _DryRun:
            pass
        except (InvalidSchedule, InvalidRoutingKey) as exc:
            # Cron and every both given or neither: shown at the interval, which keeps
            # the model's constraint on the pair from saying it a second time.
            both_or_neither = (data.get("cron") is None) == (data.get("every") is None)
            self.add_error("every" if both_or_neither else None, str(exc))
        return data
