"""The retiring secrets of a worker, on its page (rotation, docs/console.md).

A secret replaced by any writer keeps signing until it expires (pgmb.models.WorkerSecret).
The worker's page lists those rows: when each was retired and until when it signs. Whoever
may change the worker (``pgmb.change_worker``) may move that time (at most 30 days after
the retirement; a past time ends it) or revoke the secret now (its row is deleted); whoever
may only view the worker sees the times. The secret itself is never rendered, and no lookup
reaches it (WorkerAdmin.lookup_allowed refuses ``retiring_secrets__secret``).
"""

from __future__ import annotations

import datetime
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..models import MAX_SECRET_OVERLAP, Worker, WorkerSecret


def _may_change_worker(request: HttpRequest) -> bool:
    return request.user.has_perm("pgmb.change_worker")


class _ExpiryForm(forms.ModelForm):
    """The expiry's bound, as a form error: Django's own check of the model's constraint
    skips it, because retired_at, which it names, is not a field of the form."""

    class Meta:
        model = WorkerSecret
        fields = ["expires_at"]

    def clean_expires_at(self) -> datetime.datetime:
        expires_at: datetime.datetime = self.cleaned_data["expires_at"]
        retired_at = self.instance.retired_at
        if retired_at is not None and expires_at > retired_at + MAX_SECRET_OVERLAP:
            raise forms.ValidationError(
                _("A retiring secret may sign for at most 30 days after it was retired.")
            )
        return expires_at


class _RevokeFormSet(forms.BaseInlineFormSet):
    def add_fields(self, form: forms.ModelForm, index: int | None) -> None:
        super().add_fields(form, index)
        if "DELETE" in form.fields:
            form.fields["DELETE"].label = _("Revoke now")


class RetiringSecretInline(admin.StackedInline):
    """Permissions follow the worker's, not WorkerSecret's own: the rows are part of it.
    Stacked, so that the deletion box carries its label, "Revoke now"."""

    model = WorkerSecret
    form = _ExpiryForm
    formset = _RevokeFormSet
    fields = (("retired_at", "expires_at", "signing"),)
    readonly_fields = ("retired_at", "signing")
    extra = 0
    verbose_name_plural = _("Retiring secrets (still signing until they expire)")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Only the worker trigger retires a secret: replace the secret to make one.
        return False

    def has_view_permission(self, request: HttpRequest, obj: Worker | None = None) -> bool:
        return request.user.has_perm("pgmb.view_worker") or _may_change_worker(request)

    def has_change_permission(self, request: HttpRequest, obj: Worker | None = None) -> bool:
        return _may_change_worker(request)

    def has_delete_permission(self, request: HttpRequest, obj: Worker | None = None) -> bool:
        return _may_change_worker(request)

    @admin.display(boolean=True, description=_("signing now"))
    def signing(self, obj: WorkerSecret) -> bool:
        return obj.expires_at is not None and obj.expires_at > timezone.now()
