"""An endpoint's credentials go only where they were stored for (issue 26, item 8), and no
error that names an endpoint shows them (item 10).

As the users and roles concerned: a staff user who may change workers (not a superuser),
real HTTP servers on loopback recording what arrives; a pgmb_admin member writing a bad
endpoint in SQL, and the owner through pgmb.worker().
"""

from __future__ import annotations

import base64

import psycopg
import pytest
from django.contrib.auth.models import Permission

import pgmb
from pgmb.models import Worker
from tests.roles import login_role, owner  # noqa: F401

from .conftest import form_errors, url

PASSWORD = "hunter2-s3cret"


def staff(client, django_user_model, *codenames: str):
    user = django_user_model.objects.create_user("editor", password="pw", is_staff=True)
    permissions = Permission.objects.filter(content_type__app_label="pgmb", codename__in=codenames)
    assert permissions.count() == len(codenames)
    user.user_permissions.set(permissions)
    client.force_login(user)
    return client


def form_data(worker: Worker, endpoint: str) -> dict[str, str]:
    return {
        "name": worker.name,
        "endpoint": endpoint,
        "rps": "5",
        "burst": "1",
        "timeout": "2",
        "active": "on",
        "secret": "",
        "breaker_window": "60",
        "breaker_min_requests": "20",
        "breaker_cooldown": "30",
        "breaker_cooldown_max": "600",
        "_save": "Save",
    }


def post_test(client, worker: Worker):
    return client.post(
        url("worker_changelist"),
        {"action": "send_test_requests", "index": "0", "_selected_action": [str(worker.pk)]},
    )


def test_masked_credentials_do_not_follow_the_endpoint_to_another_host(
    client, django_user_model, make_recording_server, make_worker
):
    """The attack of item 8: an editor who cannot see the password moves the endpoint, the
    mask left in place, to a host of theirs, and has a test request sent there."""
    owner_host = make_recording_server()
    own_host = make_recording_server()  # the editor's: another port is another origin
    stored = owner_host.url("/hook").replace("http://", f"http://alice:{PASSWORD}@")
    worker = make_worker("orders", stored)
    editor = staff(client, django_user_model, "view_worker", "change_worker", "test_worker")

    moved = own_host.url("/steal").replace("http://", "http://***:***@")
    response = editor.post(url("worker_change", worker.pk), form_data(worker, moved))

    assert form_errors(response) == {
        "endpoint": [
            "The stored user name and password are kept only while the scheme, host and port "
            "stay the same: type them again for the new address, or remove them."
        ]
    }
    worker.refresh_from_db()
    assert worker.endpoint == stored
    assert post_test(editor, worker).status_code == 200
    assert own_host.requests == []
    [request] = owner_host.wait_for(1)
    assert request.path == "/hook" and request.headers["Authorization"].startswith("Basic ")

    # Typed again (the editor's own), the new host gets those, never the stored ones.
    retyped = own_host.url("/steal").replace("http://", "http://mallory:mine@")
    assert (
        form_errors(editor.post(url("worker_change", worker.pk), form_data(worker, retyped))) == {}
    )
    worker.refresh_from_db()
    assert worker.endpoint == retyped
    post_test(editor, worker)
    [stolen] = own_host.wait_for(1)
    assert stolen.headers["Authorization"] == "Basic bWFsbG9yeTptaW5l"  # mallory:mine


def test_an_editor_with_only_change_worker_cannot_route_deliveries_to_their_host(
    client, django_user_model, make_recording_server, make_worker, make_queue, dispatch
):
    """The same attack without the test request: a user holding change_worker alone (Django
    lets it view too) moves the endpoint and waits for the dispatcher's next delivery."""
    owner_host = make_recording_server()
    own_host = make_recording_server()
    stored = owner_host.url("/hook").replace("http://", f"http://alice:{PASSWORD}@")
    worker = make_worker("orders", stored)
    make_queue("order.*", name="orders", worker=worker)
    editor = staff(client, django_user_model, "change_worker")

    moved = own_host.url("/steal").replace("http://", "http://***:***@")
    response = editor.post(url("worker_change", worker.pk), form_data(worker, moved))
    assert list(form_errors(response)) == ["endpoint"]
    pgmb.send("order.created", {"n": 1})
    assert dispatch().delivered == 1

    assert own_host.requests == []
    [delivered] = owner_host.requests
    assert (
        delivered.headers["Authorization"]
        == "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    )


def test_the_mask_keeps_the_credentials_on_the_same_host(
    client, django_user_model, recording_server, make_worker
):
    stored = recording_server.url("/hook").replace("http://", f"http://alice:{PASSWORD}@")
    worker = make_worker("orders", stored)
    editor = staff(client, django_user_model, "view_worker", "change_worker")

    new_path = recording_server.url("/v2").replace("http://", "http://***:***@")
    response = editor.post(url("worker_change", worker.pk), form_data(worker, new_path))

    assert form_errors(response) == {}
    worker.refresh_from_db()
    assert worker.endpoint == recording_server.url("/v2").replace(
        "http://", f"http://alice:{PASSWORD}@"
    )


# --- item 10 and item 15's endpoint rule: every writer, errors masked ---------------------

BAD_ENDPOINTS = [
    f"http://alice:{PASSWORD}@[::1/hook",  # an unclosed bracket
    f"http://alice:{PASSWORD}@orders:99999/hook",  # a port out of range
    f"http://alice:{PASSWORD}@orders:0/hook",
    f"ftp://alice:{PASSWORD}@orders/hook",
    f"http://alice:{PASSWORD}@orders/a b",
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("endpoint", BAD_ENDPOINTS)
def test_a_pgmb_admin_member_writing_a_bad_endpoint_gets_it_masked(owner, login_role, endpoint):  # noqa: F811
    _, conn = login_role("pgmb_admin")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        conn.execute(
            "INSERT INTO pgmb_worker (name, endpoint, rps) VALUES ('leaky', %s, 1)", (endpoint,)
        )
    text = f"{refused.value} {refused.value.diag.message_hint}"
    assert "invalid endpoint" in text
    assert PASSWORD not in text and "alice" not in text
    assert "***:***@" in text

    # The same through pgmb.worker(), and as an UPDATE of a stored worker.
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        conn.execute("SELECT pgmb.worker('leaky', %s, 1)", (endpoint,))
    assert PASSWORD not in str(refused.value)
    conn.execute("SELECT pgmb.worker('leaky', 'http://orders/hook', 1)")
    try:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
            conn.execute("UPDATE pgmb_worker SET endpoint = %s WHERE name = 'leaky'", (endpoint,))
        assert PASSWORD not in str(refused.value)
        [(kept,)] = conn.execute("SELECT endpoint FROM pgmb_worker WHERE name = 'leaky'")
        assert kept == "http://orders/hook"
    finally:
        conn.execute("DELETE FROM pgmb_worker WHERE name = 'leaky'")


@pytest.mark.parametrize("endpoint", BAD_ENDPOINTS)
def test_the_admin_refuses_a_bad_endpoint_without_echoing_it(admin_client, make_worker, endpoint):
    worker = make_worker("orders", "http://orders/hook")

    response = admin_client.post(url("worker_change", worker.pk), form_data(worker, endpoint))

    assert list(form_errors(response)) == ["endpoint"]
    assert PASSWORD not in str(form_errors(response))
    worker.refresh_from_db()
    assert worker.endpoint == "http://orders/hook"
