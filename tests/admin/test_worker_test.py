"""Sending a test request to a worker from the admin: what the worker receives (verified
as a receiver would), the result page for answers and for failures, and the permission."""

import base64
import hashlib
import hmac
import socket
import threading

from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType

from pgmb.admin.worker_test import send_test_request
from pgmb.models import Worker
from tests.httpserver import held

from .conftest import url

SECRET = "whsec_" + base64.b64encode(b"a test secret of pgmb").decode()


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
    assert outcome.excerpt == "x" * 500 and outcome.truncated
    assert "500 Internal Server Error" in response.content.decode()


def test_a_redirect_is_shown_not_followed(admin_client, recording_server, make_worker):
    worker = make_worker(endpoint=recording_server.url("/hook"))
    recording_server.respond(302, "", headers={"Location": recording_server.url("/elsewhere")})

    outcome = result(post_test(admin_client, [worker]))

    assert outcome.status == 302
    assert outcome.response_headers["Location"].endswith("/elsewhere")
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
    assert outcome.error == "Timed out waiting for the answer (timeout 0.2 s)."


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
