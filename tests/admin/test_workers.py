"""Workers in the admin: the list, the add form's checks, and the write-only secret."""

import pytest
from django.utils.html import escape

from pgmb.models import Worker

from .conftest import form_errors, table_rows, url


def worker_data(**changes):
    data = {
        "name": "orders",
        "endpoint": "https://orders.example.com/hook",
        "rps": "25",
        "burst": "0.5",
        "timeout": "5",
        "active": "on",
        "secret": "",
        # The circuit breaker's fields, as the form renders them (off).
        "breaker_window": "60",
        "breaker_min_requests": "20",
        "breaker_cooldown": "30",
        "breaker_cooldown_max": "600",
        "_save": "Save",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def test_changelist_lists_workers_with_their_queue_counts(admin_client, make_worker, make_queue):
    billing = make_worker(
        "billing", "https://billing.example.com/in", rps=7, secret="s3cr3t-xyz-16-bytes"
    )
    make_worker("idle", "http://127.0.0.1:9000/", active=False)
    make_queue("invoice.*", name="invoices", worker=billing)
    make_queue("refund.#", name="refunds", worker=billing)

    response = admin_client.get(url("worker_changelist"))

    assert response.status_code == 200
    rows = {row.split("</a>")[0].rsplit(">", 1)[1]: row for row in table_rows(response)}
    assert set(rows) == {"billing", "idle"}
    assert f'worker__id__exact={billing.pk}">2</a>' in rows["billing"]
    assert '<td class="field-queue_count"><a' in rows["idle"]
    assert ">0</a>" in rows["idle"]
    assert ">paused<" in rows["idle"]
    assert "s3cr3t-xyz-16-bytes" not in response.content.decode()
    # The endpoint, rate and signing are on the worker's page (the list has no room).
    page = admin_client.get(url("worker_change", billing.pk)).content.decode()
    assert "https://billing.example.com/in" in page
    assert 'name="rps" value="7"' in page
    assert "s3cr3t-xyz-16-bytes" not in page


def test_changelist_search_finds_by_name_and_endpoint(admin_client, make_worker):
    make_worker("billing", "https://billing.example.com/in")
    make_worker("shipping", "https://ship.example.org/in")

    by_name = admin_client.get(url("worker_changelist"), {"q": "bill"})
    by_host = admin_client.get(url("worker_changelist"), {"q": "example.org"})

    assert [">billing<" in row for row in table_rows(by_name)] == [True]
    assert [">shipping<" in row for row in table_rows(by_host)] == [True]


def test_add_form_creates_the_worker(admin_client, db):
    response = admin_client.post(
        url("worker_add"), worker_data(secret="whsec_YWJjZGVmZ2hpamtsbW5vcA")
    )

    assert form_errors(response) == {}
    worker = Worker.objects.get(name="orders")
    assert (worker.endpoint, worker.rps, worker.burst, worker.timeout, worker.active) == (
        "https://orders.example.com/hook",
        25,
        0.5,
        5.0,
        True,
    )
    assert worker.secret == "whsec_YWJjZGVmZ2hpamtsbW5vcA"


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"name": "Orders"}, "name", "invalid worker name 'Orders'"),
        ({"name": "my worker"}, "name", "invalid worker name 'my worker'"),
        ({"name": "o'brien"}, "name", 'invalid worker name "o\'brien"'),
        ({"name": "x; drop table"}, "name", "invalid worker name 'x; drop table'"),
        ({"name": ""}, "name", "This field is required."),
        ({"endpoint": "ftp://files.example.com/in"}, "endpoint", "http:// or https:// URL"),
        ({"endpoint": "orders.example.com/hook"}, "endpoint", "http:// or https:// URL"),
        ({"endpoint": "javascript:alert(1)"}, "endpoint", "http:// or https:// URL"),
        ({"endpoint": "http:///path"}, "endpoint", "http:// or https:// URL"),
        ({"endpoint": "http://exa mple.com/"}, "endpoint", "without blanks"),
        ({"endpoint": "http://example.com/a\u00a0b"}, "endpoint", "without blanks"),
        ({"secret": "whsec_topsecret"}, "secret", "Invalid secret: the base64 after 'whsec_'"),
        ({"secret": "whsec_ab-_cd"}, "secret", "Invalid secret: after 'whsec_' comes"),
        ({"secret": "tab\tsecret"}, "secret", "Invalid secret: a secret may not contain"),
        ({"rps": "0"}, "rps", "greater than or equal to 1"),
        ({"rps": "-5"}, "rps", "greater than or equal to"),
        ({"burst": "0"}, "burst", "greater than or equal to 0.001"),
        ({"timeout": "0"}, "timeout", "greater than or equal to 0.001"),
        ({"max_in_flight": "0"}, "max_in_flight", "greater than or equal to 1"),
        ({"max_in_flight": "-1"}, "max_in_flight", "greater than or equal to 1"),
        ({"max_in_flight": "1.5"}, "max_in_flight", "Enter a whole number."),
        ({"dead_statuses": "410, 6xx"}, "dead_statuses", "'6xx' is not an HTTP status"),
        ({"dead_statuses": "abc"}, "dead_statuses", "'abc' is not an HTTP status"),
        ({"dead_statuses": "99"}, "dead_statuses", "'99' is not an HTTP status"),
        ({"dead_statuses": "600"}, "dead_statuses", "'600' is not an HTTP status"),
        ({"dead_statuses": "2xx"}, "dead_statuses", "(100 to 599, not 2xx)"),
        ({"retried_statuses": "4xx"}, "retried_statuses", "'4xx' is not an HTTP status"),
        (
            {"dead_statuses": "4xx,429", "retried_statuses": "429"},
            "retried_statuses",
            "429 is in dead_statuses too.",
        ),
    ],
)
def test_add_form_rejects_bad_input(admin_client, db, changes, field, message):
    response = admin_client.post(url("worker_add"), worker_data(**changes))

    errors = form_errors(response)
    assert any(message in text for text in errors.get(field, [])), errors
    assert escape(message) in response.content.decode()
    assert not Worker.objects.exists()


def test_answers_that_stop_retries_are_stored_normalised(admin_client, make_worker):
    worker = make_worker("orders")

    response = admin_client.post(
        url("worker_change", worker.pk),
        worker_data(dead_statuses="4XX, 410 ,410", retried_statuses="429,408"),
    )

    assert form_errors(response) == {}
    worker.refresh_from_db()
    assert (worker.dead_statuses, worker.retried_statuses) == (["410", "4xx"], ["408", "429"])
    page = admin_client.get(url("worker_change", worker.pk)).content.decode()
    assert 'value="410,4xx"' in page


def test_a_bad_status_changes_nothing(admin_client, make_worker):
    worker = make_worker("orders", dead_statuses=["410"])

    response = admin_client.post(
        url("worker_change", worker.pk), worker_data(dead_statuses="410,6xx")
    )

    assert "dead_statuses" in form_errors(response)
    worker.refresh_from_db()
    assert worker.dead_statuses == ["410"]


def test_a_cap_on_requests_in_flight_is_set_and_cleared(admin_client, make_worker):
    worker = make_worker("orders")
    assert worker.max_in_flight is None

    response = admin_client.post(url("worker_change", worker.pk), worker_data(max_in_flight="2"))

    assert form_errors(response) == {}
    worker.refresh_from_db()
    assert worker.max_in_flight == 2
    assert (
        'name="max_in_flight" value="2"'
        in admin_client.get(url("worker_change", worker.pk)).content.decode()
    )
    admin_client.post(url("worker_change", worker.pk), worker_data(max_in_flight=""))
    worker.refresh_from_db()
    assert worker.max_in_flight is None


@pytest.mark.parametrize("cap", ["0", "-1"])
def test_a_bad_cap_changes_nothing(admin_client, make_worker, cap):
    worker = make_worker("orders", max_in_flight=3)

    response = admin_client.post(url("worker_change", worker.pk), worker_data(max_in_flight=cap))

    assert "greater than or equal to 1" in form_errors(response)["max_in_flight"][0]
    worker.refresh_from_db()
    assert worker.max_in_flight == 3


def test_duplicate_name_is_a_form_error(admin_client, make_worker):
    make_worker("orders")

    response = admin_client.post(url("worker_add"), worker_data())

    assert form_errors(response) == {"name": ["Worker with this Name already exists."]}
    assert Worker.objects.count() == 1


def test_secret_is_never_rendered_back(admin_client, make_worker):
    worker = make_worker(
        "signed", "https://a.example.com/", secret="whsec_dG9wc2VjcmV0LTE2LWJ5dGVz"
    )

    page = admin_client.get(url("worker_change", worker.pk)).content.decode()

    assert "whsec_dG9wc2VjcmV0LTE2LWJ5dGVz" not in page
    assert 'type="password" name="secret"' in page
    assert "A secret is set. Leave blank to keep it" in page
    assert 'name="clear_secret"' in page


def test_add_form_has_no_clear_secret_box(admin_client, db):
    page = admin_client.get(url("worker_add")).content.decode()

    assert 'type="password" name="secret"' in page
    assert 'name="clear_secret"' not in page


@pytest.mark.parametrize(
    ("changes", "stored"),
    [
        ({"secret": ""}, "whsec_b2xkLXNlY3JldC0xNi1ieXRlcw"),  # blank keeps the secret
        ({"secret": "whsec_bmV3LXNlY3JldC0xNi1ieXRlcw"}, "whsec_bmV3LXNlY3JldC0xNi1ieXRlcw"),
        ({"secret": "", "clear_secret": "on"}, ""),
    ],
)
def test_changing_the_secret(admin_client, make_worker, changes, stored):
    worker = make_worker(
        "orders", "https://orders.example.com/hook", secret="whsec_b2xkLXNlY3JldC0xNi1ieXRlcw"
    )

    response = admin_client.post(url("worker_change", worker.pk), worker_data(rps="3", **changes))

    assert form_errors(response) == {}
    worker.refresh_from_db()
    assert (worker.secret, worker.rps) == (stored, 3)


def test_new_secret_and_clear_together_is_an_error(admin_client, make_worker):
    worker = make_worker(
        "orders", "https://orders.example.com/hook", secret="whsec_b2xkLXNlY3JldC0xNi1ieXRlcw"
    )

    response = admin_client.post(
        url("worker_change", worker.pk),
        worker_data(secret="whsec_bmV3LXNlY3JldC0xNi1ieXRlcw", clear_secret="on"),
    )

    assert form_errors(response) == {"secret": ["Either type a new secret or remove it, not both."]}
    worker.refresh_from_db()
    assert worker.secret == "whsec_b2xkLXNlY3JldC0xNi1ieXRlcw"


def test_worker_with_queues_cannot_be_deleted(admin_client, make_queue):
    queue = make_queue("#", name="audit")

    response = admin_client.post(
        url("worker_delete", queue.worker_id), {"post": "yes"}, follow=True
    )

    assert "would require deleting the following protected related objects" in (
        response.content.decode()
    )
    assert Worker.objects.filter(pk=queue.worker_id).exists()


def test_changelist_queries_do_not_grow_with_rows(
    admin_client, make_worker, make_queue, count_queries, django_assert_max_num_queries
):
    for _ in range(3):
        make_queue("#", worker=make_worker())
    admin_client.get(url("worker_changelist"))  # warm up: the session, caches
    few = count_queries(lambda: admin_client.get(url("worker_changelist")))
    for _ in range(27):
        make_queue("#", worker=make_worker())

    with django_assert_max_num_queries(few):
        response = admin_client.get(url("worker_changelist"))

    assert len(table_rows(response)) == 30
