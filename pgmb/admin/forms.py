"""Admin forms. The rules the database enforces are the models' validators too (see
pgmb.models), so an operator gets a form error next to the field, not a trigger error."""

from __future__ import annotations

from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from ..endpoint_masking import CredentialsNotCarried, keep_credentials, mask_credentials
from ..models import Worker


class WorkerForm(forms.ModelForm):
    """Worker form whose secret is write-only: it is never rendered back into the page; and
    whose endpoint is shown with its credentials masked (kept unless retyped, and only for
    the same scheme, host and port)."""

    secret = forms.CharField(
        required=False,
        max_length=200,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
    )
    clear_secret = forms.BooleanField(
        required=False,
        label=_("Remove the secret"),
        help_text=_(
            "Stop signing with this secret. It keeps signing while it retires, unless revoked."
        ),
    )

    class Meta:
        model = Worker
        fields = [
            "name",
            "endpoint",
            "rps",
            "burst",
            "timeout",
            "max_in_flight",
            "active",
            "secret",
            "breaker_failures",
            "breaker_rate",
            "breaker_window",
            "breaker_min_requests",
            "breaker_cooldown",
            "breaker_cooldown_max",
            "dead_statuses",
            "retried_statuses",
        ]
        widgets = {"endpoint": forms.URLInput(attrs={"class": "vURLField"})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.initial["endpoint"] = mask_credentials(self.instance.endpoint)
        if self.instance.pk and self.instance.secret:
            self.fields["secret"].help_text = _(
                "A secret is set. Leave blank to keep it, or type a new one to replace it. "
                "Requests are signed the Standard Webhooks way. A replaced or removed secret "
                "keeps signing beside the new one until it expires (the retiring secrets "
                "below), so that receivers can switch over."
            )
        else:
            self.fields["secret"].help_text = _(
                "Optional. When set, requests are signed the Standard Webhooks way."
            )
            del self.fields["clear_secret"]

    def clean_endpoint(self) -> str:
        endpoint: str = self.cleaned_data.get("endpoint", "")
        if self.instance.pk:
            try:
                return keep_credentials(endpoint, self.instance.endpoint)
            except CredentialsNotCarried:
                raise forms.ValidationError(
                    _(
                        "The stored user name and password are kept only while the scheme, "
                        "host and port stay the same: type them again for the new address, "
                        "or remove them."
                    ),
                    code="credentials_not_carried",
                ) from None
        return endpoint

    def clean_secret(self) -> str:
        secret = self.cleaned_data.get("secret", "")
        if not secret and self.instance.pk:
            # The field is never pre-filled, so a blank one means "unchanged".
            return self.initial.get("secret") or ""
        return secret

    def clean(self) -> dict[str, Any]:
        super().clean()  # ModelForm's returns self.cleaned_data; its stub says dict | None
        data = self.cleaned_data
        if data.get("clear_secret"):
            if self.data.get(self.add_prefix("secret")):
                self.add_error("secret", _("Either type a new secret or remove it, not both."))
            else:
                data["secret"] = ""
        return data
