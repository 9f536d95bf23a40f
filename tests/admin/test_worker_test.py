"""Sending a test request to a worker from the admin: what the worker receives (verified
as a receiver would), the result page for answers and for failures, and the permission."""

import asyncio
import base64
import hashlib
import hmac
import socket
import threading
import time

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType

from pgmb.admin.worker_test import send_test_request
from pgmb.dispatch.client import USER_AGENT
from pgmb.models import Worker
from tests.httpserver import held
from tests.security.trickle import trickling

from .conftest import form_errors, url

SECRET = "whsec_" + base64.b64encode(b"a test secret of pgmb").decode()
TIMED_OUT = (
    "Timed out: no answer within the worker's timeout (%s s), name resolution and "
    "connecting included."
)


def post_test(client, workers):
    return client.post(
        url("worker_changelist"),
        {
            "action": "send_test_requests",
            "index": "0",
            "_selected_action": [str(w.pk) for w in workers],
        },
    )


def result(response):
    assert response.status_code == 200, response.status_code
    return response.context["result"]


def verify(secret: str, headers, body: bytes) -> bool:
    """Standard Webhooks verification, written from the spec as a receiver would."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(
        hmac.compare_digest(part.removeprefix("v1,"), expected)
        for part in headers["webhook-signature"].split()
    )


def test_the_worker_receives_a_signed_test_request(admin_client, recording_server, make_worker):
    worker = make_worker(endpoint=recording_server.url("/hook"), secret=SECRET)
    recording_server.respond(200, {"ok": True})

    response = post_test(admin_client, [worker])

    outcome = result(response)
    [request] = recording_server.wait_for(1)
    assert (request.method, request.path) == ("POST", "/hook")
    body = request.json()
    assert body["pgmb"] == "test" and body["sent_at"]
    assert request.headers["content-type"] == "application/json"
    assert request.headers["pgmb-message-id"] == outcome.message_id
    assert request.headers["pgmb-routing-key"] == "pgmb.test"
    assert request.headers["pgmb-queue"] == "-"
    assert request.headers["pgmb-attempt"] == "1"
    assert request.headers["pgmb-test"] == "1"
    assert request.headers["webhook-id"] == outcome.message_id
    assert request.headers["user-agent"] == USER_AGENT  # the dispatcher's own client
    assert verify(SECRET, request.headers, request.body)
    assert not verify(
        "whsec_" + base64.b64encode(b"another").decode(), request.headers, request.body
    )
    assert (outcome.status, outcome.error) == (200, "")
    assert outcome.excerpt == '{"ok": true}'
    page = response.content.decode()
    assert "200 OK" in page and "{&quot;ok&quot;: true}" in page and " ms" in page


def test_an_unsigned_worker_gets_no_signature(admin_client, recording_server, make_worker):
    worker = make_worker(endpoint=recording_server.url("/"))
    result(post_test(admin_client, [worker]))
    [request] = recording_server.wait_for(1)
    assert "webhook-signature" not in request.headers


def test_a_500_is_shown_with_the_start_of_its_body(admin_client, recording_server, make_worker):
    worker = make_worker(endpoint=recording_server.url("/hook"))
    recording_server.respond(500, "x" * 2000)

    response = post_test(admin_client, [worker])

    outcome = result(response)
    assert outcome.status == 500 and not outcome.ok
    assert outcome.excerpt == "x" * 200 and outcome.truncated
    assert "500 Internal Server Error" in response.content.decode()


def test_a_redirect_is_shown_not_followed(admin_client, recording_server, make_worker):
    worker = make_worker(endpoint=recording_server.url("/hook"))
    recording_server.respond(302, "", headers={"Location": recording_server.url("/elsewhere")})

    outcome = result(post_test(admin_client, [worker]))

    assert outcome.status == 302
    assert outcome.response_headers["location"].endswith("/elsewhere")
    assert [r.path for r in recording_server.requests] == ["/hook"]


def test_a_closed_port_is_reported(admin_client, make_worker):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens
    worker = make_worker(endpoint=f"http://127.0.0.1:{port}/hook")

    response = post_test(admin_client, [worker])

    outcome = result(response)
    assert outcome.status is None
    assert outcome.error.startswith("Could not connect")
    assert "No answer" in response.content.decode()


def test_an_endpoint_slower_than_the_timeout_is_reported(
    admin_client, recording_server, make_worker
):
    worker = make_worker(endpoint=recording_server.url("/hook"), timeout=0.2)
    gate = threading.Event()
    recording_server.script([held(gate)])
    try:
        outcome = result(post_test(admin_client, [worker]))
    finally:
        gate.set()

    assert outcome.status is None
    assert outcome.error == TIMED_OUT % 0.2


@pytest.mark.django_db  # which secrets sign is asked of the database (pgmb.signing_secrets)
def test_a_bad_secret_is_reported_without_sending(recording_server):
    # The database refuses such a secret; a worker object that holds one is still reported.
    worker = Worker(name="w", endpoint=recording_server.url("/hook"), secret="whsec_!!")
    outcome = send_test_request(worker)
    assert outcome.error.startswith("Not sent: invalid worker secret")
    assert "whsec_!!" not in outcome.error
    assert recording_server.requests == []


def test_one_worker_at_a_time(admin_client, recording_server, make_worker):
    workers = [make_worker(endpoint=recording_server.url("/")) for _ in range(2)]
    response = post_test(admin_client, workers)
    assert response.status_code == 302
    shown = [str(m) for m in admin_client.get(response["Location"]).context["messages"]]
    assert shown == ["Select one worker to send a test request to."]
    assert recording_server.requests == []


def test_staff_without_the_permission_is_neither_offered_nor_allowed(
    client, django_user_model, recording_server, make_worker
):
    worker = make_worker(endpoint=recording_server.url("/"))
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type=ContentType.objects.get_for_model(Worker), codename="view_worker"
        )
    )
    client.force_login(user)

    page = client.get(url("worker_changelist"))
    form = page.context["action_form"]
    assert form is None or "send_test_requests" not in dict(form.fields["action"].choices)
    assert post_test(client, [worker]).status_code == 403
    assert recording_server.requests == []

    user.user_permissions.add(Permission.objects.get(codename="test_worker"))
    client.force_login(django_user_model.objects.get(pk=user.pk))
    result(post_test(client, [worker]))
    assert len(recording_server.requests) == 1


# --- issue 21: a total deadline, the endpoint policy, a record, a short escaped excerpt ---


def test_the_timeout_bounds_the_whole_exchange(admin_client, make_worker):
    # The server sends its head one byte every 50 ms (about 13 s in all): each read is
    # well within the 0.5 s timeout, the whole is not.
    with trickling(0.05) as endpoint:
        worker = make_worker(endpoint=endpoint, timeout=0.5)
        started = time.monotonic()
        outcome = result(post_test(admin_client, [worker]))
        took = time.monotonic() - started

    assert outcome.status is None
    assert outcome.error == TIMED_OUT % 0.5
    assert took < 3, took


def test_a_link_local_endpoint_is_refused_before_connecting(admin_client, make_worker):
    # 169.254.169.254 (a cloud's metadata service) is refused by default; the refusal comes
    # from the address check, before any socket is made (nothing leaves this machine).
    worker = make_worker(endpoint="http://169.254.169.254/latest/meta-data/")

    outcome = result(post_test(admin_client, [worker]))

    assert outcome.status is None
    assert outcome.error == (
        "Not sent: 169.254.169.254 resolves to 169.254.169.254, which "
        "PGMB['ENDPOINT_POLICY'] refuses."
    )


@pytest.fixture
def rebinding(monkeypatch):
    """Name resolution of the test-only name rebind.pgmb.test: 127.0.0.1 at the first
    lookup, 127.0.0.2 at every later one (a DNS answer that changes after a check)."""
    real = socket.getaddrinfo
    answers = iter(["127.0.0.1"])

    def getaddrinfo(host, port, *args, **kwargs):
        if host == "rebind.pgmb.test":
            host = next(answers, "127.0.0.2")
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


DENY_127_0_0_2 = {"ENDPOINT_POLICY": {"allow": ["127.0.0.1/32"], "deny": ["127.0.0.2/32"]}}


def test_an_answer_that_changes_after_the_check_is_refused_at_connect(
    admin_client, make_recording_server, rebinding, settings
):
    settings.PGMB = DENY_127_0_0_2
    denied = make_recording_server()
    denied.host = "127.0.0.2"
    denied.start()
    endpoint = f"http://rebind.pgmb.test:{denied.port}/hook"
    # Saving checks the name's answer of the moment, 127.0.0.1: allowed.
    response = admin_client.post(
        url("worker_add"),
        {
            "name": "rebound",
            "endpoint": endpoint,
            "rps": "5",
            "burst": "1",
            "timeout": "2",
            "active": "on",
            "breaker_window": "60",
            "breaker_min_requests": "20",
            "breaker_cooldown": "30",
            "breaker_cooldown_max": "600",
        },
    )
    assert response.status_code == 302
    worker = Worker.objects.get(name="rebound")

    outcome = result(post_test(admin_client, [worker]))

    assert outcome.error == (
        "Not sent: rebind.pgmb.test resolves to 127.0.0.2, which PGMB['ENDPOINT_POLICY'] refuses."
    )
    assert denied.requests == []


def test_saving_a_worker_with_a_refused_endpoint_is_a_clear_error(admin_client, db, settings):
    response = admin_client.post(
        url("worker_add"),
        {
            "name": "metadata",
            "endpoint": "http://169.254.169.254/latest/",
            "rps": "5",
            "burst": "1",
            "timeout": "2",
            "active": "on",
            "breaker_window": "60",
            "breaker_min_requests": "20",
            "breaker_cooldown": "30",
            "breaker_cooldown_max": "600",
        },
    )

    assert form_errors(response) == {
        "endpoint": [
            "169.254.169.254 resolves to 169.254.169.254, which PGMB['ENDPOINT_POLICY'] "
            "refuses (docs/security.md, Endpoints)"
        ]
    }
    assert not Worker.objects.filter(name="metadata").exists()


def test_a_test_request_is_recorded_in_the_history(admin_client, recording_server, make_worker):
    worker = make_worker(endpoint=recording_server.url("/hook"))
    recording_server.respond(204)

    result(post_test(admin_client, [worker]))

    [entry] = LogEntry.objects.filter(object_id=str(worker.pk))
    assert entry.user.username == "admin"
    assert entry.get_change_message() == (
        f"Sent a test request to {recording_server.url('/hook')}: HTTP 204 No Content"
    )


def test_the_page_shows_a_short_escaped_excerpt(admin_client, recording_server, make_worker):
    worker = make_worker(endpoint=recording_server.url("/hook"))
    recording_server.respond(500, b"<script>alert(1)</script>\x1b[31m\x00" + b"s" * 5000)

    response = post_test(admin_client, [worker])

    outcome = result(response)
    assert outcome.excerpt == "<script>alert(1)</script>\\x1b[31m\\x00" + "s" * 169
    assert outcome.truncated
    page = response.content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\x1b[31m\\x00" in page
    assert "<script>alert" not in page and "s" * 170 not in page


# --- issue 26, item 15: one client, whose deadline bounds name resolution too ---


class _StalledResolver(asyncio.DefaultEventLoopPolicy):
    """Event loops whose name resolution of stall.pgmb.test never answers (a resolver that
    does not reply), and of every other name as usual: the loop the test request runs on
    is made by the policy (asyncio.run), as any asyncio program's."""

    def __init__(self, asked: threading.Event) -> None:
        super().__init__()
        self.asked = asked

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        loop = super().new_event_loop()
        real = loop.getaddrinfo
        asked = self.asked

        async def getaddrinfo(host, port, **kwargs):
            if host == "stall.pgmb.test":
                asked.set()
                await asyncio.Event().wait()  # no answer, ever
            return await real(host, port, **kwargs)

        loop.getaddrinfo = getaddrinfo  # type: ignore[method-assign]
        return loop


@pytest.fixture
def stalled_resolver():
    asked = threading.Event()
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_StalledResolver(asked))
    yield asked
    asyncio.set_event_loop_policy(previous)


def test_a_resolver_that_never_answers_ends_at_the_deadline(
    admin_client, make_worker, stalled_resolver
):
    # Saving resolves with the system's resolver (the name does not exist: not refused).
    worker = make_worker(endpoint="http://stall.pgmb.test:8080/hook", timeout=0.3)

    outcome = result(post_test(admin_client, [worker]))

    assert stalled_resolver.is_set()  # the name was asked on the deadline's path
    assert outcome.status is None
    assert outcome.error == TIMED_OUT % 0.3


def test_the_endpoint_s_credentials_go_as_basic_to_its_own_host(
    admin_client, recording_server, make_worker
):
    endpoint = recording_server.url("/hook").replace("http://", "http://alice:pa%40ss@")
    worker = make_worker(endpoint=endpoint)

    outcome = result(post_test(admin_client, [worker]))

    [request] = recording_server.wait_for(1)
    assert request.headers["Authorization"] == "Basic " + base64.b64encode(b"alice:pa@ss").decode()
    assert outcome.endpoint == recording_server.url("/hook").replace("http://", "http://***:***@")
    assert "pa%40ss" not in str(outcome.sent_headers)
