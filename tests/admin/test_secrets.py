"""Secrets stay secret in the admin: a worker's secret is never rendered, no URL lookup or
search can test a guess of it (or of the credentials in an endpoint), and an endpoint's
user name and password are masked wherever the console shows them
(docs/decisions/0028-secrets-stay-secret-in-the-admin.md)."""

from __future__ import annotations

import socket

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

import pgmb
from pgmb.endpoint_masking import CredentialsNotCarried, keep_credentials, mask_credentials
from pgmb.models import Attempt, DeadLetter, Worker

from .conftest import form_errors, table_rows, url

SECRET = "whsec_c2VjcmV0LWtleS0xMjM0NTY3OA=="  # base64 of "secret-key-12345678"
ENDPOINT = "https://hookuser:hookpass42@orders.example.com:8443/in?x=1"
MASKED = "https://***:***@orders.example.com:8443/in?x=1"
NEW_SECRET = "whsec_bmV3LXNlY3JldC0xNi1ieXRlcw=="  # base64 of "new-secret-16-bytes"
#: What no page may contain: the secret, its base64 part, and the endpoint's credentials.
NEVER_SHOWN = (SECRET, "c2VjcmV0LWtleS0xMjM0NTY3OA", "hookuser", "hookpass42")


def staff(client, django_user_model, *codenames: str):
    """``client`` logged in as a staff user (not a superuser) with only these permissions."""
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    permissions = Permission.objects.filter(content_type__app_label="pgmb", codename__in=codenames)
    user.user_permissions.set(permissions)
    assert permissions.count() == len(codenames), "unknown permission"
    client.force_login(user)
    return client


def assert_nothing_secret(html: str) -> None:
    for text in NEVER_SHOWN:
        assert text not in html, text


@pytest.fixture
def signed(make_worker, make_queue) -> Worker:
    worker = make_worker("orders", ENDPOINT, secret=SECRET)
    make_queue("order.*", name="orders", worker=worker)
    return worker


# The masking function, one table of cases.

MASKING = [
    ("https://u:p@h:8443/a?b=1#f", "https://***:***@h:8443/a?b=1#f"),
    ("http://token@h/", "http://***@h/"),
    ("http://u:@h/", "http://***:***@h/"),
    ("http://u:p@[::1]:8000/x", "http://***:***@[::1]:8000/x"),
    ("https://u:p%40x@h/", "https://***:***@h/"),
    ("http://a@b@h/", "http://***@h/"),
    ("http://h:8000/a@b", "http://h:8000/a@b"),  # an "@" in the path is no credential
    ("http://h/?to=a@b.c", "http://h/?to=a@b.c"),
    ("http://127.0.0.1:9/", "http://127.0.0.1:9/"),
    ("http://[::1@h/", "***"),  # unparsable, with an "@": masked whole
    ("not a url", "not a url"),
]


@pytest.mark.parametrize(("url", "shown"), MASKING)
def test_mask_credentials(url, shown):
    assert mask_credentials(url) == shown


@pytest.mark.parametrize(
    ("submitted", "stored", "meant"),
    [
        (MASKED, ENDPOINT, ENDPOINT),  # unchanged
        ("https://***:***@orders.example.com:8443/v2", ENDPOINT, "https://hookuser:hookpass42@orders.example.com:8443/v2"),
        ("https://***:***@ORDERS.example.com:8443/", ENDPOINT, "https://hookuser:hookpass42@ORDERS.example.com:8443/"),
        ("https://***@h/", "https://tok@h/", "https://tok@h/"),
        ("https://***@h:443/", "https://tok@h/", "https://tok@h:443/"),  # the default port
        ("https://orders.example.com/in", ENDPOINT, "https://orders.example.com/in"),  # removed
        ("https://a:b@h/", ENDPOINT, "https://a:b@h/"),  # retyped
        ("https://***@h/", ENDPOINT, "https://***@h/"),  # not the mask it was shown
    ],
)  # fmt: skip
def test_keep_credentials(submitted, stored, meant):
    assert keep_credentials(submitted, stored) == meant


@pytest.mark.parametrize(
    "submitted",
    [
        "https://***:***@new.example.com:8443/in",  # another host
        "https://***:***@orders.example.com/in",  # another port (443)
        "https://***:***@orders.example.com:8444/in",
        "http://***:***@orders.example.com:8443/in",  # another scheme
        "https://***:***@orders.example.com.evil.test:8443/in",
    ],
)
def test_masked_credentials_do_not_move_to_another_origin(submitted):
    """Issue 26, item 8: the mask keeps the stored credentials only for the same scheme,
    host and port."""
    with pytest.raises(CredentialsNotCarried):
        keep_credentials(submitted, ENDPOINT)


# A user who may only view workers.


def test_a_viewer_sees_neither_the_secret_nor_the_credentials(client, django_user_model, signed):
    viewer = staff(client, django_user_model, "view_worker", "view_queue")

    change = viewer.get(url("worker_change", signed.pk))
    listing = viewer.get(url("worker_changelist"))
    history = viewer.get(url("worker_history", signed.pk))
    queues = viewer.get(url("queue_changelist"))

    for response in (change, listing, history, queues):
        assert response.status_code == 200
        assert_nothing_secret(response.content.decode())
    page = change.content.decode()
    assert '<div class="readonly">set</div>' in page
    assert f'<div class="readonly">{MASKED.replace("&", "&amp;")}</div>' in page
    assert 'name="secret"' not in page and 'name="clear_secret"' not in page
    # The list shows no endpoint at all: the page shows it, masked.
    (row,) = table_rows(listing)
    assert "field-masked_endpoint" not in row and "example.com" not in row


def test_a_viewer_sees_not_set_for_an_unsigned_worker(client, django_user_model, make_worker):
    worker = make_worker("plain", "http://127.0.0.1:9/")
    viewer = staff(client, django_user_model, "view_worker")

    page = viewer.get(url("worker_change", worker.pk)).content.decode()

    assert '<div class="readonly">not set</div>' in page
    assert '<div class="readonly">http://127.0.0.1:9/</div>' in page


# No guessing oracle: lookups and searches on hidden fields.

ORACLES = [
    ("worker_changelist", "secret__startswith", "whsec_c2Vj", "whsec_AAAA"),
    ("worker_changelist", "secret", SECRET, "whsec_AAAA"),
    ("worker_changelist", "secret__exact", SECRET, "whsec_AAAA"),
    ("worker_changelist", "secret__regex", "^whsec_c", "^whsec_A"),
    ("worker_changelist", "secret__contains", "S0xMjM0", "S0xMjM1"),
    ("worker_changelist", "secret__gt", "whsec_c", "whsec_z"),
    ("worker_changelist", "secret__isnull", "False", "True"),
    ("worker_changelist", "endpoint__contains", "hookpass4", "hookpass5"),
    ("worker_changelist", "endpoint__startswith", "https://hookuser:", "https://x:"),
    ("worker_changelist", "endpoint__iregex", "hookpass4", "hookpass5"),
    ("queue_changelist", "worker__secret__startswith", "whsec_c2Vj", "whsec_AAAA"),
    ("queue_changelist", "worker__endpoint__contains", "hookpass4", "hookpass5"),
    # Through a delivery's, dead letter's or attempt's queue (Django refuses these already).
    ("delivery_changelist", "queue__worker__secret__startswith", "whsec_c2Vj", "whsec_AAAA"),
    ("deadletter_changelist", "queue__worker__secret__startswith", "whsec_c2Vj", "whsec_AAAA"),
    ("attempt_changelist", "queue__worker__endpoint__contains", "hookpass4", "hookpass5"),
]


@pytest.mark.parametrize(("page", "lookup", "right", "wrong"), ORACLES)
def test_lookups_on_hidden_fields_are_refused(
    client, django_user_model, signed, page, lookup, right, wrong
):
    viewer = staff(
        client, django_user_model, "view_worker", "view_queue", "view_delivery",
        "view_deadletter", "view_attempt",
    )  # fmt: skip

    answers = [viewer.get(url(page), {lookup: guess}) for guess in (right, wrong)]

    # The same refusal for a right and a wrong guess: nothing to learn from the answer.
    assert [a.status_code for a in answers] == [400, 400]
    assert answers[0].content == answers[1].content


@pytest.mark.parametrize(
    ("right", "wrong"), [("hookpass4", "hookpass5"), ("hookuser:", "hookusr:")]
)
def test_the_search_does_not_match_credentials(client, django_user_model, signed, right, wrong):
    viewer = staff(client, django_user_model, "view_worker")

    answers = [viewer.get(url("worker_changelist"), {"q": guess}) for guess in (right, wrong)]

    assert [a.context["cl"].result_count for a in answers] == [0, 0]


def test_the_search_still_finds_endpoints_without_credentials(admin_client, make_worker, signed):
    make_worker("shipping", "https://ship.example.org/in")

    by_host = admin_client.get(url("worker_changelist"), {"q": "example.org"})
    by_name = admin_client.get(url("worker_changelist"), {"q": "orde"})

    assert [">shipping<" in row for row in table_rows(by_host)] == [True]
    assert [">orders<" in row for row in table_rows(by_name)] == [True]


@pytest.mark.parametrize(("right", "wrong"), [("hookpass4", "hookpass5"), ("hookuser", "hookusr")])
def test_the_autocomplete_does_not_match_credentials(
    client, django_user_model, signed, right, wrong
):
    viewer = staff(client, django_user_model, "view_worker", "view_queue")

    def results(term: str) -> list[dict[str, str]]:
        response = viewer.get(
            "/admin/autocomplete/",
            {"app_label": "pgmb", "model_name": "queue", "field_name": "worker", "term": term},
        )
        assert response.status_code == 200
        assert_nothing_secret(response.content.decode())
        return response.json()["results"]

    assert results(right) == results(wrong) == []
    assert results("ord") == [{"id": str(signed.pk), "text": "orders"}]


# A user who may change workers: replaces the secret and the endpoint, never sees them.


@pytest.fixture
def editor(client, django_user_model):
    return staff(client, django_user_model, "view_worker", "change_worker")


def form_data(**changes):
    data = {
        "name": "orders",
        "endpoint": MASKED,
        "rps": "25",
        "burst": "0.5",
        "timeout": "5",
        "active": "on",
        "secret": "",
        "breaker_window": "60",
        "breaker_min_requests": "20",
        "breaker_cooldown": "30",
        "breaker_cooldown_max": "600",
        "_save": "Save",
    }
    data.update(changes)
    return data


def test_an_editor_sees_neither_the_secret_nor_the_credentials(editor, signed):
    page = editor.get(url("worker_change", signed.pk)).content.decode()

    assert_nothing_secret(page)
    assert 'type="password" name="secret"' in page
    assert 'name="clear_secret"' in page
    assert f'name="endpoint" value="{MASKED.replace("&", "&amp;")}"' in page


@pytest.mark.parametrize(
    ("changes", "secret", "endpoint"),
    [
        ({}, SECRET, ENDPOINT),  # the form sent back as shown changes nothing
        ({"secret": NEW_SECRET}, NEW_SECRET, ENDPOINT),
        ({"clear_secret": "on"}, "", ENDPOINT),
        (
            {"endpoint": "https://***:***@orders.example.com:8443/v2"},
            SECRET,
            "https://hookuser:hookpass42@orders.example.com:8443/v2",
        ),
        ({"endpoint": "https://orders.example.com/in"}, SECRET, "https://orders.example.com/in"),
        ({"endpoint": "https://new:pw@orders.example.com/"}, SECRET, "https://new:pw@orders.example.com/"),
    ],
)  # fmt: skip
def test_an_editor_replaces_what_they_cannot_see(editor, signed, changes, secret, endpoint):
    response = editor.post(url("worker_change", signed.pk), form_data(**changes))

    assert form_errors(response) == {}
    signed.refresh_from_db()
    assert (signed.secret, signed.endpoint) == (secret, endpoint)
    assert_nothing_secret(editor.get(url("worker_change", signed.pk)).content.decode())


# Credentials in what the dispatcher logs and stores, and the console shows of it.


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_failing_endpoint_s_credentials_reach_no_log_error_or_page(
    dispatch, make_worker, make_queue, admin_client, caplog
):
    # A host name IDNA cannot encode (a label over 63 characters) fails before any
    # connection, with the URL in the error; a closed loopback port fails to connect.
    unencodable = make_worker("idna", f"http://hookuser:hookpass42@{'é' * 64}.example/in")
    closed = make_worker("closed", f"http://hookuser:hookpass42@127.0.0.1:{free_port()}/in")
    for worker in (unencodable, closed):
        make_queue(f"{worker.name}.#", name=worker.name, worker=worker, max_retries=0)
        pgmb.send(f"{worker.name}.created", {"n": 1})

    with caplog.at_level("INFO", logger="pgmb"):
        stats = dispatch()

    assert (stats.claimed, stats.failed) == (2, 2)
    errors = sorted(Attempt.objects.values_list("error", flat=True))
    assert errors[0].startswith("connection failed: ")
    masked = f"http://***:***@{'é' * 64}.example/in"
    assert errors[1].startswith(
        f"pgmb's own failure: could not send the request: invalid host name in '{masked}': "
    )
    assert sorted(DeadLetter.objects.values_list("last_error", flat=True)) == errors
    logged = caplog.text
    assert "dead-lettered" in logged and "http://***:***@" in logged
    pages = [
        admin_client.get(url("worker_changelist")),
        admin_client.get(url("attempt_changelist")),
        admin_client.get(url("deadletter_changelist")),
        admin_client.get(reverse("admin:pgmb_dashboard")),
        admin_client.get("/metrics"),
    ]
    for text in (logged, *errors, *(page.content.decode() for page in pages)):
        assert "hookuser" not in text and "hookpass42" not in text
    assert all(page.status_code == 200 for page in pages)
