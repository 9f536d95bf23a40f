"""Sending a test request to a worker from the admin.

The action POSTs, from the admin's process and synchronously, what a worker receives for a
delivery (:func:`pgmb.worker_request.build_headers`: pgmb's headers, signed the Standard
Webhooks way with each secret that signs its deliveries, retiring ones included) with a
small JSON body of its own and the header ``pgmb-test: 1``, and shows what came back: the
status, the time taken, a short escaped excerpt of the answer, or why there was none
(refused, timed out, TLS, a bad secret...).

It is sent by the external dispatcher's own HTTP client (:class:`pgmb.dispatch.http1.Client`
with the dispatcher's User-Agent), so that the rules are one implementation, not two: the
worker's timeout is a total deadline, name resolution included (a resolver that stalls or a
server that sends one byte at a time cannot hold the admin's process longer); the connection
is made only to an address of the endpoint's name that ``PGMB["ENDPOINT_POLICY"]`` allows,
checked after resolution (pgmb.endpoint_policy): nothing leaves for a refused address;
redirects are not followed; the endpoint's user name and password are sent as Basic
credentials. Each test request is recorded in the admin's history (a LogEntry on the
worker); no message, delivery or attempt is stored. Granted by the Worker model's
permission ``pgmb.test_worker``; one worker at a time.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.timezone import now
from django.utils.translation import gettext as _

from .. import endpoint_policy
from ..dispatch import http1
from ..dispatch.client import USER_AGENT
from ..endpoint_masking import mask_credentials
from ..models import Worker
from ..worker_request import build_headers
from ..worker_secrets import signing_secrets

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

TEST_PERMISSION = "pgmb.test_worker"
RESULT_TEMPLATE = "admin/pgmb/worker_test_result.html"
ROUTING_KEY = "pgmb.test"
#: How much of the answer's body the result page shows: a glimpse, not a proxy's output.
EXCERPT_BYTES = 200


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
    #: The answer's first EXCERPT_BYTES bytes, decoded leniently, control characters and
    #: other unprintables written as escapes (the template escapes HTML).
    excerpt: str = ""
    truncated: bool = False
    response_headers: dict[str, str] = field(default_factory=dict)
    #: Why there was no answer ("" when there was one).
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def escaped_excerpt(chunk: bytes) -> str:
    """``chunk`` as text, every unprintable character but a line break written as its
    escape (a terminal sequence or a NUL shows as ``\\x1b``, ``\\x00``)."""
    text = chunk.decode("utf-8", "replace")
    return "".join(
        c if c.isprintable() or c in "\n\t" else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


async def _post(worker: Worker, body: bytes, headers: dict[str, str]) -> http1.Response:
    """One POST through a client of its own, closed after it (nothing kept alive)."""
    client = http1.Client(kept=1, policy=endpoint_policy.current())
    try:
        return await client.post(
            worker.endpoint,
            body,
            {**headers, "User-Agent": USER_AGENT},
            worker.timeout,
            EXCERPT_BYTES + 1,
            keep_success=True,
        )
    finally:
        await client.close()


def send_test_request(worker: Worker) -> TestResult:
    """POST a test request to ``worker`` and return what happened; never raises for
    anything the endpoint or the network does."""
    message_id = str(uuid.uuid4())
    body = json.dumps(
        {"pgmb": "test", "sent_at": now().isoformat(), "worker": worker.name}
    ).encode()
    result = TestResult(
        endpoint=mask_credentials(worker.endpoint), message_id=message_id, body=body.decode()
    )
    try:
        headers = build_headers(
            message_id=message_id,
            routing_key=ROUTING_KEY,
            queue="-",
            attempt=1,
            headers=None,
            body=body,
            secrets=signing_secrets(worker),
            timestamp=int(time.time()),
        )
    except ValueError as exc:  # the secret breaks the rule; the message never quotes it
        result.error = _("Not sent: %(problem)s.") % {"problem": exc}
        return result
    headers["pgmb-test"] = "1"
    result.sent_headers = headers
    started = time.perf_counter()
    try:
        # The admin's views are synchronous: this thread runs no event loop of its own.
        response = asyncio.run(_post(worker, body, headers))
    except Exception as exc:
        result.error = _error_text(exc, worker.timeout)
    else:
        result.status = response.status
        result.reason = response.reason
        result.response_headers = dict(response.headers)
        result.truncated = len(response.body) > EXCERPT_BYTES
        result.excerpt = escaped_excerpt(response.body[:EXCERPT_BYTES])
    result.duration_ms = (time.perf_counter() - started) * 1000
    return result


def _error_text(exc: Exception, timeout: float) -> str:
    """Why a test request got no answer, in the result page's words."""
    cause = exc.__cause__
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return _(
            "Timed out: no answer within the worker's timeout (%(timeout)s s), name "
            "resolution and connecting included."
        ) % {"timeout": timeout}
    if isinstance(cause, endpoint_policy.EndpointRefused):
        return _("Not sent: %(problem)s.") % {"problem": cause}
    if isinstance(exc, ValueError):  # a URL or a header that cannot be sent (masked)
        return _("Not sent: %(problem)s.") % {"problem": exc}
    if isinstance(cause, ssl.SSLError):
        return _("TLS error: %(error)s") % {"error": cause}
    if isinstance(exc, http1.BadResponse):
        return _("Invalid answer: %(error)s") % {"error": exc}
    if isinstance(exc, http1.HttpError | OSError):
        return _("Could not connect or the connection failed: %(error)s") % {"error": exc}
    # The page reports anything, never a 500.
    return _("The request failed: %(error)s") % {"error": f"{type(exc).__name__}: {exc}"}


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
    outcome = result.error or f"HTTP {result.status} {result.reason}".strip()
    # Recorded, as any change from the admin: who sent a request where, and what came of it.
    model_admin.log_change(
        request, worker, f"Sent a test request to {result.endpoint}: {outcome[:200]}"
    )
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
