"""Sending a test request to a worker from the admin.

The action POSTs, from the admin's process and synchronously, what a worker receives for a
delivery (:func:`pgmb.worker_request.build_headers`: pgmb's headers, signed the Standard
Webhooks way with each secret that signs its deliveries, retiring ones included) with a
small JSON body of its own and the header ``pgmb-test: 1``, and shows what came back: the
status, the time taken, a short escaped excerpt of the answer, or why there was none
(refused, timed out, TLS, a bad secret...).
Redirects are not followed (neither does the dispatcher).

The worker's timeout is a total deadline, as on both dispatch paths: connecting, sending and
reading the answer all end by then (a server that sends one byte at a time cannot hold the
admin's process longer). The connection is made only to an address of the endpoint's name
that ``PGMB["ENDPOINT_POLICY"]`` allows, checked after resolution (pgmb.endpoint_policy):
nothing leaves for a refused address. Each test request is recorded in the admin's history
(a LogEntry on the worker); no message, delivery or attempt is stored. Granted by the Worker
model's permission ``pgmb.test_worker``; one worker at a time.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
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
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from .. import endpoint_policy
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


class _Guard:
    """One test request's deadline and endpoint policy, applied where urllib3 connects.

    urllib3's timeouts bound each read, not the whole: a watchdog shuts the connection down
    at the deadline, which ends any read in progress (plain or TLS) at once."""

    def __init__(self, timeout: float, policy: endpoint_policy.Policy) -> None:
        self.deadline = time.monotonic() + timeout
        self.policy = policy
        self.expired = False
        self.refused: endpoint_policy.EndpointRefused | None = None
        self._timers: list[tuple[threading.Timer, socket.socket]] = []

    def connect(self, host: str, port: int, options: Any) -> socket.socket:
        try:
            sock = endpoint_policy.open_checked(
                host, port, self.deadline, self.policy, options or ()
            )
        except endpoint_policy.EndpointRefused as exc:
            self.refused = exc
            raise
        watched = sock.dup()  # the dup keeps the socket alive for the watchdog
        timer = threading.Timer(
            max(0.0, self.deadline - time.monotonic()), self._expire, (watched,)
        )
        timer.daemon = True
        self._timers.append((timer, watched))
        timer.start()
        return sock

    def _expire(self, sock: socket.socket) -> None:
        self.expired = True
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        for timer, sock in self._timers:
            timer.cancel()
            sock.close()

    def adapter(self) -> HTTPAdapter:
        """A requests adapter whose connections are made by :meth:`connect`."""
        guard = self

        class Plain(HTTPConnection):
            def _new_conn(self) -> socket.socket:
                return guard.connect(self._dns_host, self.port, self.socket_options)

        class Tls(HTTPSConnection):  # TLS still checks the endpoint's name (self.host)
            def _new_conn(self) -> socket.socket:
                return guard.connect(self._dns_host, self.port, self.socket_options)

        pools = {
            "http": type("PlainPool", (HTTPConnectionPool,), {"ConnectionCls": Plain}),
            "https": type("TlsPool", (HTTPSConnectionPool,), {"ConnectionCls": Tls}),
        }

        class Adapter(HTTPAdapter):
            def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
                super().init_poolmanager(*args, **kwargs)
                self.poolmanager.pool_classes_by_scheme = pools

        return Adapter(max_retries=0)


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
    guard = _Guard(worker.timeout, endpoint_policy.current())
    try:
        with requests.Session() as session:
            session.trust_env = False  # as the dispatcher: no proxies or netrc from the env
            adapter = guard.adapter()
            session.mount("http://", adapter)
            session.mount("https://", adapter)
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
                result.excerpt = escaped_excerpt(chunk[:EXCERPT_BYTES])
    except Exception as exc:
        result.error = _error_text(exc, guard, worker.timeout)
    finally:
        guard.close()
    result.duration_ms = (time.perf_counter() - started) * 1000
    return result


def _error_text(exc: Exception, guard: _Guard, timeout: float) -> str:
    """Why a test request got no answer, in the result page's words."""
    if guard.refused is not None:
        return _("Not sent: %(problem)s.") % {"problem": guard.refused}
    if guard.expired:  # the watchdog ended the exchange: the same words as a read timeout
        return _("Timed out waiting for the answer (timeout %(timeout)s s).") % {"timeout": timeout}
    try:
        raise exc
    except requests.exceptions.SSLError as exc:
        return _("TLS error: %(error)s") % {"error": exc}
    except requests.exceptions.ConnectTimeout:
        return _("Timed out connecting (timeout %(timeout)s s).") % {"timeout": timeout}
    except requests.exceptions.ReadTimeout:
        return _("Timed out waiting for the answer (timeout %(timeout)s s).") % {"timeout": timeout}
    except requests.exceptions.ConnectionError as exc:
        return _("Could not connect or the connection failed: %(error)s") % {"error": exc}
    except Exception as exc:  # the page reports anything, never a 500
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
