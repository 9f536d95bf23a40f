"""A worker's timeout is shorter than the lease of every queue it delivers for: a request
that outlasts its lease lets the delivery be claimed and posted again while it runs."""

import pytest
from django.core.exceptions import ValidationError

from tests.admin.conftest import form_errors, url

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


def test_the_admin_refuses_a_timeout_as_long_as_a_lease(admin_client, make_queue):
    queue = make_queue(lease_seconds=5)
    make_queue(worker=queue.worker, lease_seconds=30)
    worker = queue.worker

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
    assert worker.timeout == 10.0

    accepted = admin_client.post(
        url("worker_change", worker.pk), {**WORKER_FORM, "name": worker.name, "timeout": "4.5"}
    )
    assert form_errors(accepted) == {}
    worker.refresh_from_db()
    assert worker.timeout == 4.5


def test_full_clean_refuses_it_too(make_queue):
    worker = make_queue(lease_seconds=2).worker
    worker.timeout = 3
    with pytest.raises(ValidationError) as caught:
        worker.full_clean()
    assert list(caught.value.message_dict) == ["timeout"]
