"""Secret rotation in the database (docs/decisions/0038-secret-rotation.md): which secrets
sign (pgmb.signing_secrets, one table of cases read through SQL, the claim and the admin's
Python), how every writer retires a replaced secret, the bounds on a retiring secret, the
housekeeping of expired ones, the claim's cost, and who may read them."""

from __future__ import annotations

import datetime

import psycopg
import pytest
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.test import RequestFactory

import pgmb
from pgmb import deliveries, housekeeping, worker_secrets
from pgmb.admin.topology import WorkerAdmin
from pgmb.models import Worker, WorkerSecret

A = "whsec_QUFBQUFBQUFBQUFBQUFBQQ=="
B = "whsec_QkJCQkJCQkJCQkJCQkJCQg"
C = "a raw secret, 16+ bytes"
D = "another raw secret"

# (current secret, retiring rows as (secret, retired seconds ago, expires in seconds), the
# secrets that sign, in order)
SIGNING = [
    ("", [], []),
    (A, [], [A]),
    (A, [(B, 60, 3600)], [A, B]),
    (A, [(B, 60, -1)], [A]),  # expired: never again
    (A, [(C, 120, 3600), (B, 60, 3600)], [A, B, C]),  # the most recently retired first
    (A, [(C, 120, 3600), (B, 60, -1), (D, 30, 10)], [A, D, C]),
    ("", [(B, 60, 3600)], [B]),  # a removed secret signs while it retires
    ("", [(B, 60, -5)], []),
]


def _store(sql, worker: Worker, retiring: list[tuple[str, int, int]]) -> None:
    for secret, ago, expires_in in retiring:
        sql(
            "INSERT INTO pgmb_worker_secret (worker_id, secret, retired_at, expires_at)"
            " VALUES (%s, %s, now() - %s * interval '1 second', now() + %s * interval '1 second')",
            (worker.pk, secret, ago, expires_in),
        )


@pytest.mark.parametrize(("current", "retiring", "signing"), SIGNING)
def test_which_secrets_sign(make_worker, make_queue, sql, current, retiring, signing):
    worker = make_worker(secret=current)
    make_queue("#", worker=worker)
    _store(sql, worker, retiring)
    pgmb.send("k", 1)

    [(by_sql,)] = sql("SELECT pgmb.signing_secrets(secret, id, now()) FROM pgmb_worker")
    [claimed] = deliveries.claim(None, 10)

    assert by_sql == signing
    assert claimed.secrets == signing  # what both dispatch paths sign with
    assert worker_secrets.signing_secrets(worker) == signing  # the admin's test request
    # What the monitoring view and the admin's list say: signed, while any secret signs.
    assert sql("SELECT signed FROM pgmb.workers") == [(bool(signing),)]
    request = RequestFactory().get("/")
    [listed] = WorkerAdmin(Worker, admin.site).get_queryset(request)
    assert WorkerAdmin.signed(WorkerAdmin(Worker, admin.site), listed) is bool(signing)


def _retiring(worker: Worker) -> list[str]:
    return list(WorkerSecret.objects.filter(worker=worker).values_list("secret", flat=True))


@pytest.mark.parametrize("writer", ["orm_save", "queryset_update", "sql_update"])
def test_every_writer_retires_the_replaced_secret(make_worker, sql, writer):
    worker = make_worker(secret=A)
    if writer == "orm_save":
        worker.secret = B
        worker.save()
    elif writer == "queryset_update":
        Worker.objects.filter(pk=worker.pk).update(secret=B)
    else:
        sql("UPDATE pgmb_worker SET secret = %s WHERE id = %s", (B, worker.pk))

    [(secret, overlap, default)] = sql(
        "SELECT secret, expires_at - retired_at, pgmb.secret_overlap() FROM pgmb_worker_secret"
    )
    assert secret == A
    assert overlap == default == datetime.timedelta(hours=24)


def test_what_retires_and_what_does_not(make_worker, sql):
    worker = make_worker(secret=A)
    worker.rps = 7
    worker.save()  # the secret is written unchanged: nothing retires
    sql("UPDATE pgmb_worker SET tokens = 3 WHERE id = %s", (worker.pk,))  # a claim's update
    assert _retiring(worker) == []

    Worker.objects.filter(pk=worker.pk).update(secret=B)
    Worker.objects.filter(pk=worker.pk).update(secret=A)  # back: A is current, not retiring
    assert _retiring(worker) == [B]
    Worker.objects.filter(pk=worker.pk).update(secret="")  # removed: A retires too
    assert sorted(_retiring(worker)) == sorted([A, B])

    # A secret stored before the rule (triggers off), which cannot sign, does not retire.
    unsigned = make_worker(secret="")
    with transaction.atomic():
        sql("SET LOCAL session_replication_role = replica")
        sql("UPDATE pgmb_worker SET secret = 'whsec_a' WHERE id = %s", (unsigned.pk,))
    Worker.objects.filter(pk=unsigned.pk).update(secret=C)
    assert _retiring(unsigned) == []


def test_a_retiring_secret_is_bounded_and_usable(make_worker, sql):
    worker = make_worker(secret=A)
    Worker.objects.filter(pk=worker.pk).update(secret=B)
    row = WorkerSecret.objects.get()

    too_long = row.retired_at + datetime.timedelta(days=30, seconds=1)
    with (
        pytest.raises(IntegrityError, match="pgmb_worker_secret_expiry_bounded"),
        transaction.atomic(),
    ):
        sql("UPDATE pgmb_worker_secret SET expires_at = %s", (too_long,))
    row.expires_at = too_long
    with pytest.raises(ValidationError, match="at most 30 days"):
        row.full_clean()
    sql("UPDATE pgmb_worker_secret SET expires_at = retired_at + interval '30 days'")

    for bad in ("", "whsec_a", "tab\tsecret"):
        with pytest.raises(IntegrityError, match="pgmb_worker_secret_usable"), transaction.atomic():
            _store(sql, worker, [(bad, 0, 60)])


def test_deleting_a_worker_in_sql_takes_its_retiring_secrets(make_worker, sql):
    worker = make_worker(secret=A)
    Worker.objects.filter(pk=worker.pk).update(secret=B)
    sql("DELETE FROM pgmb_worker WHERE id = %s", (worker.pk,))
    assert not WorkerSecret.objects.exists()


def test_housekeeping_removes_expired_secrets_only(make_worker, sql):
    live, expired = make_worker(secret=A), make_worker(secret=A)
    _store(sql, live, [(B, 60, 3600)])
    _store(sql, expired, [(B, 60, -1), (C, 60, -60)])

    assert sql("SELECT pgmb.forget_expired_secrets()") == [(2,)]
    assert list(WorkerSecret.objects.values_list("worker_id", flat=True)) == [live.pk]

    _store(sql, expired, [(D, 60, -1)])
    sql("SELECT pgmb.maintenance()")  # the pg_cron path's housekeeping
    assert list(WorkerSecret.objects.values_list("worker_id", flat=True)) == [live.pk]


@pytest.mark.django_db(transaction=True)
def test_the_dispatchers_housekeeping_removes_expired_secrets(make_worker, sql):
    worker = make_worker(secret=A)
    _store(sql, worker, [(B, 60, 3600), (C, 60, -1)])

    report = housekeeping.housekeep()

    assert report.expired_secrets == 1 and "1 expired retiring secret" in report.summary()
    assert _retiring(worker) == [B]


def test_the_claim_stays_one_query_with_retiring_secrets(
    make_worker, make_queue, sql, django_assert_num_queries
):
    workers = [make_worker(secret=A) for _ in range(3)]
    for n, worker in enumerate(workers):
        make_queue(f"k{n}", worker=worker)
        _store(sql, worker, [(B, 60, 3600), (C, 120, 3600)])
    pgmb.send_batch(pgmb.Outgoing(f"k{n % 3}", n) for n in range(30))
    with django_assert_num_queries(1):
        rows = deliveries.claim(None, 30)
    assert len(rows) == 30 and all(r.secrets == [A, B, C] for r in rows)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("group", ["pgmb_producer", "pgmb_consumer"])
def test_only_pgmb_admin_reads_retiring_secrets(login_role, make_worker, group):
    worker = make_worker(secret=A)
    Worker.objects.filter(pk=worker.pk).update(secret=B)
    _, session = login_role(group)
    for statement in (
        "SELECT secret FROM pgmb_worker_secret",
        "SELECT pgmb.signing_secrets('', gen_random_uuid(), now())",
        "SELECT pgmb.forget_expired_secrets()",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            session.execute(statement)
    _, admin = login_role("pgmb_admin")
    [(secrets,)] = admin.execute(
        "SELECT pgmb.signing_secrets(secret, id, now()) FROM pgmb_worker"
    ).fetchall()
    assert secrets == [B, A]
