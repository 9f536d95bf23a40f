"""A queue's *Fair shares* page in the admin: its fairness header and its keys' settings
(docs/fairness.md, docs/decisions/0093-fair-shares-from-the-admin.md), shown and set.

Every change goes through :mod:`pgmb.fairness` (``pgmb.fairness``, ``pgmb.fair_key``), as
SQL, Python and ``manage.py pgmb_fairness`` do: the rules are the database's, and a value
it refuses (a weight outside 1 to 1,000, a cap below 1, an rps that is not positive, a
header with blanks or over 255 characters) comes back as the form's error in the
database's words, nothing changed. The forms only turn text into values (a number, an
empty header as "off"). Removing a key's settings sets it back to the defaults (weight 1,
no cap, no limit): the key's row stays, since its turn is what lets a fair claim pick its
deliveries.

Granted by the Queue model's ``change`` permission, checked on every GET and POST (403
without it); each change is recorded as a ``LogEntry`` on the queue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, router, transaction
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from .. import fairness
from ..db.error_text import database_reason
from ..models import Queue

if TYPE_CHECKING:
    from django.contrib import admin

TEMPLATE = "admin/pgmb/queue_fair_shares.html"
URL_NAME = "pgmb_queue_fair_shares"

#: How many keys the page lists, in turn order; any other is set by name in the form.
KEYS_SHOWN = 500

#: PostgreSQL's integer: a number outside it is a type error, not one of fairness' rules.
INT4_MIN, INT4_MAX = -(2**31), 2**31 - 1


class HeaderForm(forms.Form):
    """The queue's fairness header; empty turns fairness off."""

    header = forms.CharField(
        label=gettext_lazy("Fairness header"),
        required=False,
        strip=False,  # the database decides what a header may hold
        help_text=gettext_lazy(
            "The message header whose values take turns, such as tenant. Empty: off, "
            "oldest first. Setting or changing it starts every key's turn afresh."
        ),
    )

    def value(self) -> str | None:
        return self.cleaned_data["header"] or None


class KeyForm(forms.Form):
    """One key's settings, all of them (an empty cap or rate lifts it)."""

    key = forms.CharField(
        label=gettext_lazy("Key"),
        required=False,
        strip=False,  # the key is the header's value as it is
        help_text=gettext_lazy("A value of the header, such as acme."),
    )
    without_header = forms.BooleanField(
        label=gettext_lazy("Messages without the header"),
        required=False,
        help_text=gettext_lazy("Their key is the empty text: leave Key empty."),
    )
    weight = forms.IntegerField(
        label=gettext_lazy("Weight"),
        initial=1,
        help_text=gettext_lazy("Deliveries a turn, 1 to 1,000."),
        min_value=INT4_MIN,
        max_value=INT4_MAX,
    )
    max_in_flight = forms.IntegerField(
        label=gettext_lazy("Max in flight"),
        required=False,
        help_text=gettext_lazy("Requests in flight at most, at least 1. Empty: no cap."),
        min_value=INT4_MIN,
        max_value=INT4_MAX,
    )
    rps = forms.FloatField(
        label=gettext_lazy("Requests a second"),
        required=False,
        help_text=gettext_lazy("Positive. Empty: no limit."),
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        key, without = data.get("key", ""), data.get("without_header")
        if without and key:
            self.add_error("key", _("Either name a key or tick Messages without the header."))
        elif not without and not key:
            self.add_error(
                "key",
                _(
                    "Name a key. The key of messages without the header is the empty "
                    "text: tick Messages without the header for it."
                ),
            )
        return data


def _describe(key: str, weight: int, max_in_flight: int | None, rps: float | None) -> str:
    """``'acme': weight 2, at most 3 in flight, 5 rps`` (the log's and the messages')."""
    parts = [_("weight %(weight)d") % {"weight": weight}]
    if max_in_flight is not None:
        parts.append(_("at most %(n)d in flight") % {"n": max_in_flight})
    if rps is not None:
        parts.append(_("%(rps)s rps") % {"rps": f"{rps:g}"})
    return f"{key!r}: {', '.join(parts)}"


class FairSharesView:
    """The page of one queue, for one request: GET shows it, POST makes one change."""

    def __init__(
        self, model_admin: admin.ModelAdmin[Any], request: HttpRequest, object_id: str
    ) -> None:
        self.model_admin = model_admin
        self.request = request
        queue = model_admin.get_object(request, object_id)
        if queue is None:
            raise Http404(_("No such queue."))
        if not model_admin.has_change_permission(request, queue):
            raise PermissionDenied
        self.queue: Queue = queue
        self.using = router.db_for_write(Queue, instance=queue) or "default"

    def respond(self) -> HttpResponse:
        header_form = HeaderForm(prefix="header", initial={"header": self._shares().header})
        key_form = KeyForm(prefix="key", initial=self._key_initial())
        if self.request.method == "POST":
            action = self.request.POST.get("_action")
            if action == "header":
                header_form = HeaderForm(self.request.POST, prefix="header")
                if header_form.is_valid() and self._set_header(header_form):
                    return self._again()
            elif action == "key":
                key_form = KeyForm(self.request.POST, prefix="key")
                if key_form.is_valid() and self._set_key(key_form):
                    return self._again()
            elif action == "reset":
                self._reset(self.request.POST.get("reset_key"))
                return self._again()
            else:
                return HttpResponseBadRequest(_("No such change: header, key or reset."))
        return self._page(header_form, key_form)

    def _shares(self) -> fairness.Shares:
        shares = fairness.shares(self.queue.name, using=self.using)
        if shares is None:  # deleted since get_object
            raise Http404(_("No such queue."))
        return shares

    def _key_initial(self) -> dict[str, Any]:
        """The settings of the key a row's Change link names (?key=…, ?without_header=1)."""
        asked = self.request.GET
        if "without_header" in asked:
            name = ""
        elif asked.get("key"):
            name = asked["key"]
        else:
            return {}
        for k in self._shares().keys:
            if k.key == name:
                return {
                    "key": name,
                    "without_header": name == "",
                    "weight": k.weight,
                    "max_in_flight": k.max_in_flight,
                    "rps": k.rps,
                }
        return {"key": name, "without_header": name == ""}

    def _write(self, form: forms.Form | None, change: Callable[[], object]) -> bool:
        """Run ``change`` in a transaction of its own; a refusal is ``form``'s error (or the
        page's message without one), nothing changed."""
        try:
            with transaction.atomic(using=self.using):
                change()
        except DatabaseError as exc:
            reason = _("Nothing changed: %(reason)s") % {"reason": database_reason(exc)}
            if form is None:
                self.model_admin.message_user(self.request, reason, messages.ERROR)
            else:
                form.add_error(None, reason)
            return False
        return True

    def _set_header(self, form: HeaderForm) -> bool:
        header = form.value()
        if header == self._shares().header:
            self.model_admin.message_user(
                self.request, _("The fairness header was already that."), messages.WARNING
            )
            return True
        if not self._write(
            form, lambda: fairness.set_header(self.queue.name, header, using=self.using)
        ):
            return False
        if header is None:
            done = _("Turned fairness off: oldest first.")
        else:
            done = _("Set the fairness header to %(header)r.") % {"header": header}
        self._done(done)
        return True

    def _set_key(self, form: KeyForm) -> bool:
        data = form.cleaned_data
        key, weight, cap, rps = data["key"], data["weight"], data["max_in_flight"], data["rps"]
        if not self._write(
            form,
            lambda: fairness.set_key(
                self.queue.name, key, weight=weight, max_in_flight=cap, rps=rps, using=self.using
            ),
        ):
            return False
        self._done(
            _("Set the fair share of key %(key)s.") % {"key": _describe(key, weight, cap, rps)}
        )
        return True

    def _reset(self, key: str | None) -> None:
        if key is None:
            self.model_admin.message_user(self.request, _("No key to reset."), messages.ERROR)
            return
        if self._write(None, lambda: fairness.set_key(self.queue.name, key, using=self.using)):
            self._done(
                _("Removed the settings of key %(key)r: weight 1, no cap, no limit.") % {"key": key}
            )

    def _done(self, text: str) -> None:
        self.model_admin.log_change(self.request, self.queue, text)
        self.model_admin.message_user(self.request, text, messages.SUCCESS)

    def _again(self) -> HttpResponseRedirect:
        return HttpResponseRedirect(self.request.path)

    def _page(self, header_form: HeaderForm, key_form: KeyForm) -> TemplateResponse:
        shares = self._shares()
        opts = self.model_admin.model._meta
        context = {
            **self.model_admin.admin_site.each_context(self.request),
            "title": _("Fair shares of queue %(queue)s") % {"queue": self.queue.name},
            "subtitle": None,
            "opts": opts,
            "original": self.queue,
            "header": shares.header,
            "keys": [
                {
                    "key": k,
                    "set": (k.weight, k.max_in_flight, k.rps) != (1, None, None),
                }
                for k in shares.keys[:KEYS_SHOWN]
            ],
            "keys_not_shown": max(0, len(shares.keys) - KEYS_SHOWN),
            "header_form": header_form,
            "key_form": key_form,
            "media": self.model_admin.media + header_form.media + key_form.media,
        }
        self.request.current_app = self.model_admin.admin_site.name
        return TemplateResponse(self.request, TEMPLATE, context)
