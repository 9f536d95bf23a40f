"""Queues in the admin: counts in the list, the add form's checks, actions, query counts."""

import pytest
from django.utils import timezone
from django.utils.html import escape

import pgmb
from pgmb import fairness
from pgmb.models import DeadLetter, Delivery, Queue

from .conftest import form_errors, table_rows, url


def queue_data(owner, **changes):
    data = {
        "name": "order_queue",
        "binding_key": "order.*",
        "worker": str(owner.pk),
        "max_retries": "3",
        "backoff_base": "1",
        "backoff_max": "60",
        "lease_seconds": "30",
        "dedup_window": "300",
        "on_expiry": "dead_letter",
        "_save": "Save",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def kill(message_id, queue):
    """Move a live delivery to the dead letters, as the state machine would."""
    Delivery.objects.filter(message_id=message_id, queue=queue).delete()
    DeadLetter.objects.create(
        message_id=message_id,
        queue=queue,
        attempts=queue.max_retries + 1,
        last_status=500,
        created_at=timezone.now(),
    )


HEALTH_COLUMNS = {
    "ready",
    "delayed",
    "leased",
    "retrying",
    "oldest_due",
    "delivered_last_hour",
    "failed_last_hour",
}


def cells(row: str) -> dict[str, str]:
    """{column: text} of a changelist row (the text inside each field-* cell)."""
    import re

    found = re.findall(r'<t[dh] class="field-(\w+)[^"]*"[^>]*>(.*?)</t[dh]>', row, re.S)
    return {name: re.sub(r"<[^>]+>", "", html).strip() for name, html in found}


def test_changelist_shows_pending_and_dead_letter_counts(admin_client, make_worker, make_queue):
    worker = make_worker("shop")
    orders = make_queue("order.*", name="order_queue", worker=worker, max_retries=2)
    audit = make_queue("#", name="audit", worker=worker, paused=True)
    make_queue("nothing.here", name="empty")
    ids = [pgmb.send("order.created", {"n": n}) for n in range(3)]
    pgmb.send("user.created", {"n": 9})
    kill(ids[0], orders)

    response = admin_client.get(url("queue_changelist"))

    assert response.status_code == 200
    rows = {cells(row)["name"]: cells(row) for row in table_rows(response)}
    order_queue = rows["order_queue"]
    # (The health columns are tested in test_health.py.)
    assert {k: order_queue[k] for k in order_queue if k not in HEALTH_COLUMNS} == {
        "name": "order_queue",
        "state": "running",
        "pending": "2",
        "dead_letters": "1",
    }
    assert (rows["audit"]["pending"], rows["audit"]["dead_letters"]) == ("4", "0")
    assert (rows["empty"]["pending"], rows["empty"]["dead_letters"]) == ("0", "0")
    # The same figures as the SQL view pgmb.queues.
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT name, pending, dead_letters FROM pgmb.queues")
        view = {name: (str(p), str(d)) for name, p, d in cursor.fetchall()}
    assert view == {name: (r["pending"], r["dead_letters"]) for name, r in rows.items()}
    assert f'href="/admin/pgmb/deadletter/?queue__id__exact={orders.pk}"' in (
        response.content.decode()
    )
    assert audit.paused


def test_changelist_filters_by_state_and_worker(admin_client, make_worker, make_queue):
    shop = make_worker("shop")
    idle = make_worker("idle", active=False)
    make_queue("#", name="running", worker=shop)
    make_queue("#", name="stopped", worker=shop, paused=True)
    make_queue("#", name="elsewhere", paused=True)
    make_queue("#", name="waiting", worker=idle)
    make_queue("#", name="both", worker=idle, paused=True)

    def names(**params):
        response = admin_client.get(url("queue_changelist"), params)
        return sorted(cells(r)["name"] for r in table_rows(response))

    assert names(state="paused") == ["both", "elsewhere", "stopped"]
    assert names(state="running") == ["running"]
    assert names(state="worker_paused") == ["waiting"]
    assert names(worker__id__exact=str(shop.pk)) == ["running", "stopped"]


def test_add_form_creates_the_queue_its_pattern_and_views(admin_client, make_worker, sql):
    worker = make_worker("shop")

    response = admin_client.post(url("queue_add"), queue_data(worker))

    assert form_errors(response) == {}
    queue = Queue.objects.get(name="order_queue")
    assert (queue.binding_key, queue.worker_id, queue.max_retries) == ("order.*", worker.pk, 3)
    assert queue.pattern == r"^\.order\.[^.]*$"
    assert sql(
        "SELECT table_name FROM information_schema.views "
        "WHERE table_schema = 'pgmb' AND table_name LIKE 'order%%' ORDER BY 1"
    ) == [("order_dead_letter_queue",), ("order_queue",)]


def test_add_form_explains_the_view_names(admin_client, db):
    page = admin_client.get(url("queue_add")).content.decode()

    assert "gets the SQL views pgmb.order_queue and pgmb.order_dead_letter_queue" in page


def test_change_form_shows_pattern_read_only_and_the_views(admin_client, make_queue):
    queue = make_queue("order.#", name="billing")

    page = admin_client.get(url("queue_change", queue.pk)).content.decode()

    assert 'name="pattern"' not in page
    assert escape(r"^\.order(?:\.[^.]*)*$") in page
    assert "Its SQL views are pgmb.billing_queue and pgmb.billing_dead_letter_queue" in page
    assert "SELECT * FROM pgmb.billing_queue WHERE acknoledge = false;" in page


def test_change_form_shows_expiry_and_fair_shares(admin_client, make_queue):
    queue = make_queue("order.#", name="billing")
    page = admin_client.get(url("queue_change", queue.pk)).content.decode()
    assert 'name="message_ttl"' in page and 'name="on_expiry"' in page
    assert "off: oldest first" in page

    fairness.set_header("billing", "tenant")
    fairness.set_key("billing", "<acme>", weight=2, max_in_flight=3)
    page = admin_client.get(url("queue_change", queue.pk)).content.decode()
    assert "keys of header tenant in turn: &lt;acme&gt;: weight 2, 3 in flight at most" in page


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"name": "OrderQueue"}, "name", "invalid queue name 'OrderQueue'"),
        ({"name": "order queue"}, "name", "invalid queue name 'order queue'"),
        ({"name": "order'queue"}, "name", 'invalid queue name "order\'queue"'),
        ({"name": "x; drop table"}, "name", "invalid queue name 'x; drop table'"),
        ({"name": "x_dead_letter"}, "name", "may not end in '_dead_letter'"),
        ({"binding_key": "a*"}, "binding_key", "wildcards must be whole words"),
        ({"binding_key": "order.#x"}, "binding_key", "wildcards must be whole words"),
        ({"binding_key": "order created"}, "binding_key", "blanks and control characters"),
        ({"binding_key": ""}, "binding_key", "This field is required."),
        ({"max_retries": "-1"}, "max_retries", "greater than or equal to 0"),
        ({"backoff_base": "10", "backoff_max": "5"}, "backoff_max", "must not be below the base"),
        ({"lease_seconds": "0"}, "lease_seconds", "greater than or equal to 0.001"),
        # The worker's timeout is 10 s (tests/rules/test_worker_timeout.py).
        ({"lease_seconds": "10"}, "lease_seconds", "longer than the timeout of worker shop"),
        # No worker is a pull queue (tests/pull/test_admin.py); an unknown one is refused.
        ({"worker": "00000000-0000-0000-0000-000000000000"}, "worker", "Select a valid choice"),
        ({"dedup_window": "-1"}, "dedup_window", "greater than or equal to 0"),
        ({"dedup_window": "2592001"}, "dedup_window", "less than or equal to 2592000"),
    ],
)
def test_add_form_rejects_bad_input(admin_client, make_worker, changes, field, message):
    worker = make_worker("shop")

    response = admin_client.post(url("queue_add"), queue_data(worker, **changes))

    errors = form_errors(response)
    assert any(message in text for text in errors.get(field, [])), errors
    assert escape(message) in response.content.decode()
    assert not Queue.objects.exists()


@pytest.mark.parametrize(
    ("existing", "name"),
    [("order_queue", "order"), ("order", "order_queue")],
)
def test_add_form_rejects_a_name_whose_views_clash(admin_client, make_queue, existing, name):
    other = make_queue("#", name=existing)

    response = admin_client.post(url("queue_add"), queue_data(other.worker, name=name))

    errors = form_errors(response)
    assert errors == {
        "name": [f"{name} clashes with queue {existing}: both would own the view pgmb.order_queue."]
    }
    assert list(Queue.objects.values_list("name", flat=True)) == [existing]
    assert "Created when the queue is saved." in response.content.decode()


def test_renaming_a_queue_to_its_own_base_is_allowed(admin_client, make_queue, sql):
    queue = make_queue("order.*", name="order_queue")

    response = admin_client.post(
        url("queue_change", queue.pk), queue_data(queue.worker, name="order")
    )

    assert form_errors(response) == {}
    queue.refresh_from_db()
    assert queue.name == "order"


def test_duplicate_name_is_a_form_error(admin_client, make_queue):
    queue = make_queue("#", name="audit")

    response = admin_client.post(url("queue_add"), queue_data(queue.worker, name="audit"))

    assert form_errors(response) == {"name": ["Queue with this Name already exists."]}
    assert Queue.objects.count() == 1


def test_changing_the_binding_recompiles_the_pattern(admin_client, make_queue):
    queue = make_queue("order.*", name="orders")

    response = admin_client.post(
        url("queue_change", queue.pk),
        queue_data(queue.worker, name="orders", binding_key="#.eu"),
    )

    assert form_errors(response) == {}
    queue.refresh_from_db()
    assert (queue.binding_key, queue.pattern) == ("#.eu", r"^(?:\.[^.]*)*\.eu$")


def test_changelist_queries_do_not_grow_with_rows(
    admin_client, make_queue, count_queries, django_assert_max_num_queries
):
    def add_queues(n):
        for _ in range(n):
            queue = make_queue("order.*")
            kill(pgmb.send("order.created", {}), queue)
            pgmb.send("order.paid", {})

    add_queues(3)
    admin_client.get(url("queue_changelist"))  # warm up: the session, caches
    few = count_queries(lambda: admin_client.get(url("queue_changelist")))
    add_queues(27)

    with django_assert_max_num_queries(few):
        response = admin_client.get(url("queue_changelist"))

    rows = [cells(row) for row in table_rows(response)]
    assert len(rows) == 30
    # Each queue got its own dead letter, and every later "order.paid" went to all earlier
    # queues too: the counts are real per-queue figures, not a constant.
    assert {row["dead_letters"] for row in rows} == {"1"}
    assert len({row["pending"] for row in rows}) > 1
