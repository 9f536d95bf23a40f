"""Sending a test request to a worker from the admin.

The action POSTs, from the admin's process and synchronously, what a worker receives for a
delivery (:func:`pgmb.worker_request.build_headers`: pgmb's headers, signed the Standard
Webhooks way with the worker's secret) with a small JSON body of its own and the header
``pgmb-test: 1``, and shows what came back: the status, the time taken, the first bytes of
the answer, or why there was none (refused, timed out, TLS, a bad secret...). Redirects are
not followed (neither does the dispatcher), the worker's timeout applies (to connecting and
to waiting for the answer's headers, as ``requests`` counts it). Nothing is stored: no
message, delivery or attempt. Granted by the Worker model's permission
``pgmb.test_worker``; one worker at a time.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import requests
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.timezone import now
from django.utils.translation import gettext as _

from ..models import Worker
from ..worker_request import build_headers

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

TEST_PERMISSION = "pgmb.test_worker"
RESULT_TEMPLATE = "admin/pgmb/worker_test_result.html"
ROUTING_KEY = "pgmb.test"
#: How much of the answer's body the result page shows.
EXCERPT_BYTES = 500


def can_test(request: HttpRequest) -> bool:
    return request.user.has_perm(TEST_PERMISSION)


@dataclass
class TestResult:
    """What one test request did."""

    endpoint: str
    message_id: str
    #: The headers sent (the signature too: it signs this test body only).
    sent_headers: dict[str, str] = field(default_factory=dict)
    body: str = ""
    status: int | None = None
    reason: str = ""
    duration_ms: float | None = None
    #: The answer's first EXCERPT_BYTES bytes, decoded leniently.
    excerpt: str = ""
    truncated: bool = False
    response_headers: dict[str, str] = field(default_factory=dict)
    #: Why there was no answer ("" when there was one).
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def send_test_request(worker: Worker) -> TestResult:
    """POST a test request to ``worker`` and return what happened; never raises for
    anything the endpoint or the network does."""
    message_id = str(uuid.uuid4())
    body = json.dumps(
        {"pgmb": "test", "sent_at": now().isoformat(), "worker": worker.name}
    ).encode()
    result = TestResult(endpoint=worker.endpoint, message_id=message_id, body=body.decode())
    try:
        headers = build_headers(
            message_id=message_id,
            routing_key=ROUTING_KEY,
            queue="-",
            attempt=1,
            headers=None,
            body=body,
            secret=worker.secret,
            timestamp=int(time.time()),
        )
    except ValueError as exc:  # the secret breaks the rule; the message never quotes it
        result.error = _("Not sent: %(problem)s.") % {"problem": exc}
        return result
    headers["pgmb-test"] = "1"
    result.sent_headers = headers
    started = time.perf_counter()
    try:
        with requests.Session() as session:
            session.trust_env = False  # as the dispatcher: no proxies or netrc from the env
            with session.post(
                worker.endpoint,
                data=body,
                headers=headers,
                timeout=worker.timeout,
                allow_redirects=False,
                stream=True,
            ) as response:
                result.status = response.status_code
                result.reason = response.reason or ""
                result.response_headers = dict(response.headers)
                chunk = response.raw.read(EXCERPT_BYTES + 1, decode_content=True) or b""
                result.truncated = len(chunk) > EXCERPT_BYTES
                result.excerpt = chunk[:EXCERPT_BYTES].decode("utf-8", "replace")
    except requests.exceptions.SSLError as exc:
        result.error = _("TLS error: %(error)s") % {"error": exc}
    except requests.exceptions.ConnectTimeout:
        result.error = _("Timed out connecting (timeout %(timeout)s s).") % {
            "timeout": worker.timeout
        }
    except requests.exceptions.ReadTimeout:
        result.error = _("Timed out waiting for the answer (timeout %(timeout)s s).") % {
            "timeout": worker.timeout
        }
    except requests.exceptions.ConnectionError as exc:
        result.error = _("Could not connect or the connection failed: %(error)s") % {"error": exc}
    except Exception as exc:  # the page reports anything, never a 500
        result.error = _("The request failed: %(error)s") % {
            "error": f"{type(exc).__name__}: {exc}"
        }
    result.duration_ms = (time.perf_counter() - started) * 1000
    return result


@admin.action(permissions=["test"], description=_("Send a test request"))
def send_test_requests(
    model_admin: ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Worker]
) -> TemplateResponse | None:
    """The action: one selected worker, a result page."""
    workers = list(queryset[:2])
    if len(workers) != 1:
        model_admin.message_user(
            request, _("Select one worker to send a test request to."), messages.WARNING
        )
        return None
    (worker,) = workers
    result = send_test_request(worker)
    opts = model_admin.model._meta
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Test request to %(worker)s") % {"worker": worker.name},
        "subtitle": None,
        "opts": opts,
        "worker": worker,
        "result": result,
        "excerpt_bytes": EXCERPT_BYTES,
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, RESULT_TEMPLATE, context)


ACTIONS = ("send_test_requests",)
