"""A worker's timeout is shorter than the lease of every queue it delivers for: a request
that outlasts its lease lets the delivery be claimed and posted again while it runs."""

import time

import pytest
from django.core.exceptions import ValidationError

import pgmb
from pgmb.models import Attempt, DeadLetter
from tests.admin.conftest import form_errors, url
from tests.security.trickle import slow_tls, trickling

WORKER_FORM = {
    "name": "slowpoke",
    "endpoint": "http://127.0.0.1:9/hook",
    "rps": "5",
    "burst": "1",
    "active": "on",
    "breaker_window": "60",
    "breaker_min_requests": "20",
    "breaker_cooldown": "30",
    "breaker_cooldown_max": "600",
}


def test_the_admin_refuses_a_timeout_as_long_as_a_lease(admin_client, make_worker, make_queue):
    worker = make_worker(timeout=4)
    make_queue(worker=worker, lease_seconds=5)
    make_queue(worker=worker, lease_seconds=30)

    response = admin_client.post(
        url("worker_change", worker.pk), {**WORKER_FORM, "name": worker.name, "timeout": "5"}
    )

    assert form_errors(response) == {
        "timeout": [
            "The timeout must be shorter than the lease of every queue this worker delivers "
            "for (the shortest is 5 s): a request that outlasts its lease is posted twice."
        ]
    }
    worker.refresh_from_db()
    assert worker.timeout == 4.0

    accepted = admin_client.post(
        url("worker_change", worker.pk), {**WORKER_FORM, "name": worker.name, "timeout": "4.5"}
    )
    assert form_errors(accepted) == {}
    worker.refresh_from_db()
    assert worker.timeout == 4.5


def test_full_clean_refuses_it_too(make_worker, make_queue):
    worker = make_queue(worker=make_worker(timeout=1), lease_seconds=2).worker
    worker.timeout = 3
    with pytest.raises(ValidationError) as caught:
        worker.full_clean()
    assert list(caught.value.message_dict) == ["timeout"]


def test_the_plpython_transport_stops_at_the_deadline(sql):
    [(present,)] = sql(
        "SELECT to_regprocedure('pgmb.post_via_plpython(text, text, jsonb, float8)') IS NOT NULL"
    )
    if not present:
        pytest.skip("plpython3u is not installed in the test database")
    # The server sends its head one byte every 50 ms (about 13 s in all): each read is well
    # within the 0.5 s timeout, the whole is not.
    with trickling(0.05) as endpoint:
        started = time.monotonic()
        [(status, error)] = sql(
            "SELECT (o).status, (o).error"
            " FROM (SELECT pgmb.post_via_plpython(%s, '{}', '{}', 0.5) AS o) AS s",
            (endpoint,),
        )
        took = time.monotonic() - started

    assert (status, error) == (None, "timeout after 0.5s")
    assert took < 3, took


@pytest.mark.django_db(transaction=True)
def test_the_tls_handshake_counts_in_the_plpython_transports_deadline(
    owner, certificate, make_worker, make_queue
):
    """A connect that takes about a second, then a handshake that never ends: the delivery
    fails at its worker's timeout, within its lease, not a handshake's timeout later."""
    owner.execute("DROP EXTENSION IF EXISTS http")
    if owner.execute("SELECT pgmb.http_transport()").fetchone()[0] != "plpython3u":
        pytest.skip("plpython3u is not installed in the test database")
    with slow_tls(certificate) as endpoint:
        make_queue(
            "#", worker=make_worker(endpoint=endpoint, timeout=2), max_retries=0, lease_seconds=2.6
        )
        pgmb.send("k", {})
        for _ in range(20):  # each CALL posts what is due, records it, then returns
            owner.execute("CALL pgmb.dispatch_loop(0.5, 1)")
            if DeadLetter.objects.exists():
                break

    [attempt] = Attempt.objects.all()
    assert (attempt.outcome, attempt.status_code, attempt.error) == (
        "dead",
        None,
        "timeout after 2s",
    )
    assert 1900 <= attempt.duration_ms < 2600
