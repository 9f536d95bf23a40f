"""Bounds on a worker's secrets (issue 26, item 15; docs/decisions/0058): at most
MAX_RETIRING_SECRETS retiring secrets sign beside the current one, however many rotations;
a new secret holds at least MIN_SECRET_BYTES bytes of key, while a shorter one stored before
the rule keeps signing. As the writers concerned: a staff user who may change workers, a
pgmb_admin member in SQL."""

from __future__ import annotations

import base64

import pytest
from django.db import connection

import pgmb
from pgmb import deliveries
from pgmb.models import Worker
from pgmb.worker_secrets import MAX_RETIRING_SECRETS, signing_secrets
from tests.roles import login_role, owner  # noqa: F401
from tests.signatures import receiver_accepts
from tests.stored_rows import store_with_triggers_off

from .conftest import form_errors, url
from .test_secrets import form_data, staff
from .test_worker_test import post_test, result


def secret(n: int) -> str:
    return "whsec_" + base64.b64encode(f"rotation secret number {n:04}".encode()).decode()


def one(statement: str, params: tuple = ()) -> object:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone()[0]


def test_rotations_in_the_admin_keep_the_newest_retiring_secrets(
    client, django_user_model, recording_server, make_worker
):
    worker = make_worker("orders", recording_server.url("/in"), secret=secret(0))
    editor = staff(client, django_user_model, "view_worker", "change_worker", "test_worker")
    for n in range(1, 9):
        form = {
            **form_data(secret=secret(n)),
            "endpoint": recording_server.url("/in"),
            # The page lists the retiring secrets (an inline): none of them changed here.
            "retiring_secrets-TOTAL_FORMS": "0",
            "retiring_secrets-INITIAL_FORMS": "0",
        }
        assert editor.post(url("worker_change", worker.pk), form).status_code == 302

    worker.refresh_from_db()
    assert worker.retiring_secrets.count() == MAX_RETIRING_SECRETS
    assert signing_secrets(worker) == [
        secret(n) for n in range(8, 8 - MAX_RETIRING_SECRETS - 1, -1)
    ]
    result(post_test(editor, [worker]))
    [request] = recording_server.wait_for(1)
    assert len(request.headers["webhook-signature"].split()) == MAX_RETIRING_SECRETS + 1
    assert receiver_accepts(secret(8), request.headers, request.body)
    assert receiver_accepts(secret(3), request.headers, request.body)
    assert not receiver_accepts(secret(2), request.headers, request.body)  # past the bound


@pytest.mark.django_db(transaction=True)
def test_300_rotations_by_a_pgmb_admin_member_leave_a_bounded_signature(login_role):  # noqa: F811
    _, conn = login_role("pgmb_admin")
    [(worker_id,)] = conn.execute("SELECT pgmb.worker('rotated', 'http://orders/in', 1)")
    try:
        for n in range(300):
            conn.execute("UPDATE pgmb_worker SET secret = %s WHERE id = %s", (secret(n), worker_id))
        [(retiring,)] = conn.execute(
            "SELECT count(*) FROM pgmb_worker_secret WHERE worker_id = %s", (worker_id,)
        )
        [(signing,)] = conn.execute(
            "SELECT pgmb.signing_secrets(secret, id, now()) FROM pgmb_worker WHERE id = %s",
            (worker_id,),
        )
        assert retiring == MAX_RETIRING_SECRETS
        assert signing == [secret(n) for n in range(299, 299 - MAX_RETIRING_SECRETS - 1, -1)]
    finally:
        conn.execute("DELETE FROM pgmb_worker WHERE id = %s", (worker_id,))


def test_retiring_rows_past_the_bound_sign_nothing(make_worker, make_queue):
    """Rows written past the bound (a direct INSERT, a 0.1.0 database): the claim hands the
    dispatchers the current secret and the newest retiring ones only."""
    worker = make_worker(secret=secret(0))
    with connection.cursor() as cursor:
        for n in range(1, 21):
            cursor.execute(
                "INSERT INTO pgmb_worker_secret (worker_id, secret, retired_at, expires_at)"
                " VALUES (%s, %s, now() - %s * interval '1 minute', now() + interval '1 hour')",
                (worker.pk, secret(n), n),
            )
    make_queue("#", worker=worker)
    pgmb.send("k", {"n": 1})
    [claim] = deliveries.claim()
    assert claim.secrets == [secret(0), *(secret(n) for n in range(1, MAX_RETIRING_SECRETS + 1))]


SHORT = "whsec_" + base64.b64encode(b"15 bytes of key").decode()


def test_a_short_secret_is_refused_in_the_admin(client, django_user_model, make_worker):
    worker = make_worker("orders", "https://orders.example.com/in")
    editor = staff(client, django_user_model, "view_worker", "change_worker")

    form = {**form_data(secret=SHORT), "endpoint": "https://orders.example.com/in"}
    response = editor.post(url("worker_change", worker.pk), form)

    assert form_errors(response) == {
        "secret": [
            "Invalid secret: a secret must hold at least 16 bytes (the base64 after 'whsec_' "
            "decoded, or the text's UTF-8 bytes)."
        ]
    }
    worker.refresh_from_db()
    assert worker.secret == ""


def test_a_short_secret_stored_before_the_rule_keeps_signing(make_worker, make_queue):
    worker = make_worker(secret=secret(0))
    # As 0.1.0 stored it (its rule took any length): the trigger is not asked.
    store_with_triggers_off("UPDATE pgmb_worker SET secret = %s WHERE id = %s", (SHORT, worker.pk))
    Worker.objects.filter(pk=worker.pk).update(active=False)  # other changes still save
    Worker.objects.filter(pk=worker.pk).update(active=True)
    make_queue("#", worker=worker)
    pgmb.send("k", {"n": 1})
    [claim] = deliveries.claim()
    assert claim.secrets == [SHORT]
    # Replaced, it retires and keeps signing for the overlap, as any usable secret does.
    Worker.objects.filter(pk=worker.pk).update(secret=secret(1))
    worker.refresh_from_db()
    assert signing_secrets(worker) == [secret(1), SHORT]
