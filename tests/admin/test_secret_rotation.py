"""Secret rotation in the console (docs/console.md): a worker's retiring secrets are listed
on its page by when they were retired and until when they sign, never by their value; only
a user who may change the worker moves that time or revokes one; the admin's form is one of
the writers that retire a replaced secret; the test request signs with every secret that
signs (docs/decisions/0038-secret-rotation.md)."""

from __future__ import annotations

import base64
import datetime

import pytest
from django.utils import timezone

from pgmb.models import Worker, WorkerSecret
from pgmb.worker_secrets import signing_secrets
from tests.signatures import receiver_accepts

from .conftest import form_errors, url
from .test_secrets import form_data, staff
from .test_worker_test import post_test, result

OLD = "whsec_" + base64.b64encode(b"the old admin secret").decode()
NEW = "whsec_" + base64.b64encode(b"the new admin secret").decode()
#: What no page may contain: either secret, or its base64 part.
NEVER_SHOWN = (OLD, NEW, OLD.removeprefix("whsec_"), NEW.removeprefix("whsec_"))


@pytest.fixture
def rotated(make_worker) -> Worker:
    """A worker whose secret OLD was replaced by NEW (OLD retires)."""
    worker = make_worker("orders", "https://orders.example.com/in", secret=OLD)
    Worker.objects.filter(pk=worker.pk).update(secret=NEW)
    worker.refresh_from_db()
    return worker


def _inline(row: WorkerSecret, *, revoke: bool = False, expires_at=None) -> dict[str, str]:
    local = timezone.localtime(expires_at or row.expires_at)
    data = {
        "retiring_secrets-TOTAL_FORMS": "1",
        "retiring_secrets-INITIAL_FORMS": "1",
        "retiring_secrets-MIN_NUM_FORMS": "0",
        "retiring_secrets-MAX_NUM_FORMS": "1000",
        "retiring_secrets-0-id": str(row.pk),
        "retiring_secrets-0-worker": str(row.worker_id),
        "retiring_secrets-0-expires_at_0": local.strftime("%Y-%m-%d"),
        "retiring_secrets-0-expires_at_1": local.strftime("%H:%M:%S"),
    }
    if revoke:
        data["retiring_secrets-0-DELETE"] = "on"
    return data


def _assert_nothing_secret(html: str) -> None:
    for text in NEVER_SHOWN:
        assert text not in html, text


def test_a_viewer_sees_when_secrets_retire_but_no_secret(client, django_user_model, rotated):
    viewer = staff(client, django_user_model, "view_worker")
    row = WorkerSecret.objects.get()

    response = viewer.get(url("worker_change", rotated.pk))

    assert response.status_code == 200
    page = response.content.decode()
    _assert_nothing_secret(page)
    assert "Retiring secrets" in page
    assert "fieldBox field-expires_at" in page and "fieldBox field-signing" in page
    assert "retiring_secrets-0-DELETE" not in page  # nothing to tick
    assert 'name="retiring_secrets-0-expires_at_0"' not in page  # nor to edit
    [inline] = response.context["inline_admin_formsets"]
    assert [f.form.instance.pk for f in inline] == [row.pk]


def test_a_viewer_cannot_revoke_or_move_the_expiry(client, django_user_model, rotated):
    viewer = staff(client, django_user_model, "view_worker")
    row = WorkerSecret.objects.get()
    sooner = row.retired_at + datetime.timedelta(minutes=5)

    revoke = viewer.post(
        url("worker_change", rotated.pk), {**form_data(), **_inline(row, revoke=True)}
    )
    move = viewer.post(
        url("worker_change", rotated.pk), {**form_data(), **_inline(row, expires_at=sooner)}
    )

    assert [revoke.status_code, move.status_code] == [403, 403]
    assert list(WorkerSecret.objects.values_list("pk", "expires_at")) == [(row.pk, row.expires_at)]
    assert signing_secrets(rotated) == [NEW, OLD]


def test_an_editor_revokes_a_retiring_secret(client, django_user_model, rotated):
    editor = staff(client, django_user_model, "view_worker", "change_worker")
    row = WorkerSecret.objects.get()
    page = editor.get(url("worker_change", rotated.pk)).content.decode()
    _assert_nothing_secret(page)
    assert 'name="retiring_secrets-0-DELETE"' in page and "Revoke now" in page

    response = editor.post(
        url("worker_change", rotated.pk), {**form_data(), **_inline(row, revoke=True)}
    )

    assert response.status_code == 302, form_errors(response)
    assert not WorkerSecret.objects.exists()
    rotated.refresh_from_db()
    assert rotated.secret == NEW  # the form's blank secret keeps the current one
    assert signing_secrets(rotated) == [NEW]


def test_an_editor_moves_the_expiry_within_30_days(client, django_user_model, rotated):
    editor = staff(client, django_user_model, "view_worker", "change_worker")
    row = WorkerSecret.objects.get()
    sooner = (row.retired_at + datetime.timedelta(minutes=5)).replace(microsecond=0)
    too_late = row.retired_at + datetime.timedelta(days=31)

    refused = editor.post(
        url("worker_change", rotated.pk), {**form_data(), **_inline(row, expires_at=too_late)}
    )
    assert refused.status_code == 200
    assert "at most 30 days" in refused.content.decode()
    assert WorkerSecret.objects.get().expires_at == row.expires_at

    moved = editor.post(
        url("worker_change", rotated.pk), {**form_data(), **_inline(row, expires_at=sooner)}
    )
    assert moved.status_code == 302, form_errors(moved)
    assert WorkerSecret.objects.get().expires_at == sooner


def test_replacing_the_secret_in_the_form_retires_the_old_one(
    client, django_user_model, make_worker
):
    editor = staff(client, django_user_model, "view_worker", "change_worker")
    worker = make_worker("orders", "https://orders.example.com/in", secret=OLD)
    form = {**form_data(secret=NEW), "endpoint": "https://orders.example.com/in"}

    response = editor.post(url("worker_change", worker.pk), form)

    assert response.status_code == 302, form_errors(response)
    assert signing_secrets(Worker.objects.get(pk=worker.pk)) == [NEW, OLD]
    _assert_nothing_secret(editor.get(url("worker_change", worker.pk)).content.decode())


@pytest.mark.parametrize(
    "lookup", ["retiring_secrets__secret__startswith", "retiring_secrets__secret"]
)
def test_no_lookup_reaches_a_retiring_secret(client, django_user_model, rotated, lookup):
    viewer = staff(client, django_user_model, "view_worker")

    answers = [viewer.get(url("worker_changelist"), {lookup: g}) for g in (OLD[:10], "whsec_AAAA")]

    assert [a.status_code for a in answers] == [400, 400]
    assert answers[0].content == answers[1].content


def test_the_test_request_signs_with_every_signing_secret(
    admin_client, recording_server, make_worker
):
    worker = make_worker(endpoint=recording_server.url("/hook"), secret=OLD)
    worker.secret = NEW
    worker.save()

    outcome = result(post_test(admin_client, [worker]))

    [request] = recording_server.wait_for(1)
    assert outcome.status == 200
    assert receiver_accepts(OLD, request.headers, request.body)
    assert receiver_accepts(NEW, request.headers, request.body)
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    _assert_nothing_secret(outcome.sent_headers.get("webhook-signature", ""))
