"""Pausing and resuming queues and workers from the admin: the actions, their permissions,
messages, log entries and statements, the state columns and filters, and end to end with a
dispatcher and a real local server."""

import re

import pytest
from django.contrib import messages as message_levels
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test.utils import CaptureQueriesContext

import pgmb
from pgmb.models import Attempt, Delivery, Queue, Worker

from .conftest import table_rows, url

QUEUE_ACTIONS = {"pause_queues", "resume_queues"}
WORKER_ACTIONS = {"pause_workers", "resume_workers"}


def post_action(client, model, action, selected):
    return client.post(
        url(f"{model}_changelist"),
        {"action": action, "index": "0", "_selected_action": [str(o.pk) for o in selected]},
    )


def action_choices(client, model) -> set[str]:
    response = client.get(url(f"{model}_changelist"))
    assert response.status_code == 200
    form = response.context["action_form"]  # None when no action is offered
    return {name for name, _label in form.fields["action"].choices} if form else set()


def reported(client, response) -> list[tuple[int, str]]:
    """The (level, text) of the messages the action left, read on the page it redirects to."""
    assert response.status_code == 302, response.status_code
    page = client.get(response["Location"])
    return [(m.level, str(m)) for m in page.context["messages"]]


def paused_queues() -> set[str]:
    return set(Queue.objects.filter(paused=True).values_list("name", flat=True))


def paused_workers() -> set[str]:
    return set(Worker.objects.filter(active=False).values_list("name", flat=True))


def logged() -> list[tuple[str, str, int, str]]:
    return sorted(
        (e.content_type.model, e.object_repr, e.action_flag, e.get_change_message())
        for e in LogEntry.objects.all()
    )


def state_cells(response) -> dict[str, str]:
    """{name: state} of a changelist page (the text of the state badge)."""
    found = {}
    for row in table_rows(response):
        name = re.search(r'class="field-name[^"]*"[^>]*>(?:<a[^>]*>)?([^<]+)<', row).group(1)
        badge = re.search(r'<td class="field-state">(<span[^>]*>([^<]*)</span>)</td>', row)
        found[name] = badge.group(2)
    return found


@pytest.fixture
def topology(make_worker, make_queue):
    """Workers shop (active) and idle (paused); queues orders, audit (paused), refunds."""
    shop = make_worker("shop")
    idle = make_worker("idle", active=False)
    return {
        "shop": shop,
        "idle": idle,
        "orders": make_queue("order.*", name="orders", worker=shop),
        "audit": make_queue("audit.*", name="audit", worker=shop, paused=True),
        "refunds": make_queue("refund.*", name="refunds", worker=idle),
    }


def staff_client(client, django_user_model, *codenames):
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__in=ContentType.objects.get_for_models(Queue, Worker).values(),
            codename__in=["view_queue", "view_worker", *codenames],
        )
    )
    client.force_login(user)
    return client


# --- superuser: the actions ---------------------------------------------------------------


def test_a_superuser_is_offered_the_actions(admin_client, topology):
    assert action_choices(admin_client, "queue") >= QUEUE_ACTIONS
    assert action_choices(admin_client, "worker") >= WORKER_ACTIONS


def test_pause_queues_changes_the_others_logs_and_counts_the_already_paused(admin_client, topology):
    selected = [topology["orders"], topology["audit"], topology["refunds"]]

    response = post_action(admin_client, "queue", "pause_queues", selected)

    assert reported(admin_client, response) == [
        (message_levels.SUCCESS, "Paused 2 queues; 1 was already paused.")
    ]
    assert paused_queues() == {"orders", "audit", "refunds"}
    assert logged() == [
        ("queue", "orders", CHANGE, "Paused from the list's action."),
        ("queue", "refunds", CHANGE, "Paused from the list's action."),
    ]
    entry = LogEntry.objects.get(object_repr="orders")
    assert entry.object_id == str(topology["orders"].pk)
    assert entry.user.username == "admin"


def test_resume_queues_counts_those_not_paused(admin_client, topology):
    selected = [topology["orders"], topology["audit"], topology["refunds"]]

    response = post_action(admin_client, "queue", "resume_queues", selected)

    assert reported(admin_client, response) == [
        (message_levels.SUCCESS, "Resumed 1 queue; 2 were not paused.")
    ]
    assert paused_queues() == set()
    assert logged() == [("queue", "audit", CHANGE, "Resumed from the list's action.")]


def test_pausing_only_paused_queues_changes_nothing_and_warns(admin_client, topology):
    response = post_action(admin_client, "queue", "pause_queues", [topology["audit"]])

    assert reported(admin_client, response) == [
        (message_levels.WARNING, "Paused 0 queues; 1 was already paused.")
    ]
    assert paused_queues() == {"audit"}
    assert not LogEntry.objects.exists()


def test_pause_and_resume_workers(admin_client, topology, make_worker):
    other = make_worker("other")
    selected = [topology["shop"], topology["idle"], other]

    paused = post_action(admin_client, "worker", "pause_workers", selected)

    assert reported(admin_client, paused) == [
        (message_levels.SUCCESS, "Paused 2 workers; 1 was already paused.")
    ]
    assert paused_workers() == {"shop", "idle", "other"}
    assert logged() == [
        ("worker", "other", CHANGE, "Paused from the list's action."),
        ("worker", "shop", CHANGE, "Paused from the list's action."),
    ]
    LogEntry.objects.all().delete()

    resumed = post_action(admin_client, "worker", "resume_workers", [topology["idle"]])

    assert reported(admin_client, resumed) == [(message_levels.SUCCESS, "Resumed 1 worker.")]
    assert paused_workers() == {"shop", "other"}
    assert logged() == [("worker", "idle", CHANGE, "Resumed from the list's action.")]
    # Pausing leaves everything else of the row alone (the trigger accepted the UPDATE).
    shop = Worker.objects.get(name="shop")
    assert (shop.endpoint, shop.rps) == (topology["shop"].endpoint, topology["shop"].rps)


@pytest.mark.parametrize(
    ("model", "action", "make"),
    [
        ("queue", "pause_queues", lambda f, n: f["make_queue"]("#", name=f"q{n}")),
        ("worker", "pause_workers", lambda f, n: f["make_worker"](f"w{n}")),
    ],
)
def test_one_update_statement_whatever_the_selection(
    admin_client, make_queue, make_worker, model, action, make
):
    fixtures = {"make_queue": make_queue, "make_worker": make_worker}
    rows = [make(fixtures, n) for n in range(30)]
    table = f'"pgmb_{model}"'

    def run(selected):
        with CaptureQueriesContext(connection) as captured:
            response = post_action(admin_client, model, action, selected)
        assert response.status_code == 302
        return [q["sql"] for q in captured.captured_queries]

    run(rows[:1])  # warm up: the session, the content type cache
    few = run(rows[1:3])
    many = run(rows[3:])

    assert len(many) == len(few)
    for statements in (few, many):
        assert sum(sql.startswith(f"UPDATE {table}") for sql in statements) == 1
        assert sum('INSERT INTO "django_admin_log"' in sql for sql in statements) == 1
    assert LogEntry.objects.count() == 30


# --- staff: permissions ---------------------------------------------------------------------


def test_staff_without_the_permissions_is_neither_offered_nor_allowed(
    client, django_user_model, topology
):
    staff = staff_client(client, django_user_model)

    assert action_choices(staff, "queue") & QUEUE_ACTIONS == set()
    assert action_choices(staff, "worker") & WORKER_ACTIONS == set()
    for model, action, selected in [
        ("queue", "pause_queues", [topology["orders"]]),
        ("queue", "resume_queues", [topology["audit"]]),
        ("worker", "pause_workers", [topology["shop"]]),
        ("worker", "resume_workers", [topology["idle"]]),
    ]:
        assert post_action(staff, model, action, selected).status_code == 403
    assert paused_queues() == {"audit"}
    assert paused_workers() == {"idle"}
    assert not LogEntry.objects.exists()


def test_pause_queue_permission_grants_only_the_queue_actions(client, django_user_model, topology):
    staff = staff_client(client, django_user_model, "pause_queue")

    assert action_choices(staff, "queue") & QUEUE_ACTIONS == QUEUE_ACTIONS
    assert action_choices(staff, "worker") & WORKER_ACTIONS == set()
    refused = post_action(staff, "worker", "pause_workers", [topology["shop"]])
    assert refused.status_code == 403
    assert paused_workers() == {"idle"}
    assert not LogEntry.objects.exists()

    response = post_action(staff, "queue", "pause_queues", [topology["orders"]])

    assert reported(staff, response) == [(message_levels.SUCCESS, "Paused 1 queue.")]
    assert paused_queues() == {"orders", "audit"}
    assert logged() == [("queue", "orders", CHANGE, "Paused from the list's action.")]


def test_pause_worker_permission_grants_only_the_worker_actions(
    client, django_user_model, topology
):
    staff = staff_client(client, django_user_model, "pause_worker")

    assert action_choices(staff, "worker") & WORKER_ACTIONS == WORKER_ACTIONS
    assert action_choices(staff, "queue") & QUEUE_ACTIONS == set()
    refused = post_action(staff, "queue", "resume_queues", [topology["audit"]])
    assert refused.status_code == 403
    assert paused_queues() == {"audit"}
    assert not LogEntry.objects.exists()

    response = post_action(staff, "worker", "resume_workers", [topology["idle"]])

    assert reported(staff, response) == [(message_levels.SUCCESS, "Resumed 1 worker.")]
    assert paused_workers() == set()
    assert logged() == [("worker", "idle", CHANGE, "Resumed from the list's action.")]


# --- state columns and filters ----------------------------------------------------------------


def test_the_queue_list_shows_each_queues_state(admin_client, topology, make_queue):
    make_queue("#", name="both", worker=topology["idle"], paused=True)

    response = admin_client.get(url("queue_changelist"))

    assert state_cells(response) == {
        "orders": "running",
        "audit": "paused",
        "refunds": "worker paused",
        "both": "paused",
    }
    html = response.content.decode()
    assert "pgmb-state-worker-paused" in html
    assert "Its worker idle is paused" in html
    assert "<script" not in html.split('id="result_list"', 1)[1].split("</table>", 1)[0]


def test_the_worker_list_shows_each_workers_state_and_filters_by_it(admin_client, topology):
    response = admin_client.get(url("worker_changelist"))
    active = admin_client.get(url("worker_changelist"), {"state": "active"})
    paused = admin_client.get(url("worker_changelist"), {"state": "paused"})

    assert state_cells(response) == {"shop": "active", "idle": "paused"}
    assert state_cells(active) == {"shop": "active"}
    assert state_cells(paused) == {"idle": "paused"}


@pytest.mark.parametrize("model", ["queue", "worker"])
def test_list_queries_are_pinned_whatever_the_states(
    admin_client, make_worker, make_queue, count_queries, django_assert_num_queries, model
):
    def add(n):
        for i in range(n):
            worker = make_worker(active=i % 2 == 0)
            make_queue("#", worker=worker, paused=i % 3 == 0)

    add(3)
    admin_client.get(url(f"{model}_changelist"))  # warm up: the session, caches
    few = count_queries(lambda: admin_client.get(url(f"{model}_changelist")))
    add(27)

    with django_assert_num_queries(few):
        response = admin_client.get(url(f"{model}_changelist"))

    states = state_cells(response)
    assert len(states) == 30
    expected = {"running", "paused", "worker paused"} if model == "queue" else {"active", "paused"}
    assert set(states.values()) == expected


# --- end to end: a dispatcher and a real local server ----------------------------------------


def test_a_paused_queue_waits_and_is_delivered_after_resume_from_the_admin(
    dispatch, recording_server, make_worker, make_queue, admin_client
):
    worker = make_worker("shop", endpoint=recording_server.url("/hook"))
    queue = make_queue("order.*", name="orders", worker=worker)
    paused = post_action(admin_client, "queue", "pause_queues", [queue])
    assert reported(admin_client, paused) == [(message_levels.SUCCESS, "Paused 1 queue.")]
    message_id = pgmb.send("order.created", {"order_id": 7})

    stats = dispatch()  # --until-idle does not wait for a paused queue

    assert (stats.claimed, stats.delivered) == (0, 0)
    assert recording_server.requests == []
    assert list(Delivery.objects.values_list("message_id", "attempts")) == [(message_id, 0)]

    resumed = post_action(admin_client, "queue", "resume_queues", [queue])
    assert reported(admin_client, resumed) == [(message_levels.SUCCESS, "Resumed 1 queue.")]

    stats = dispatch()

    assert stats.delivered == 1
    (request,) = recording_server.wait_for(1)
    assert request.path == "/hook"
    assert request.headers["pgmb-message-id"] == str(message_id)
    assert request.json() == {"order_id": 7}
    assert not Delivery.objects.exists()
    assert list(Attempt.objects.values_list("outcome", flat=True)) == ["ack"]


def test_a_paused_worker_waits_and_is_delivered_after_resume_from_the_admin(
    dispatch, recording_server, make_worker, make_queue, admin_client
):
    worker = make_worker("shop", endpoint=recording_server.url("/hook"))
    make_queue("order.*", name="orders", worker=worker)
    make_queue("order.#", name="order_audit", worker=worker)
    paused = post_action(admin_client, "worker", "pause_workers", [worker])
    assert reported(admin_client, paused) == [(message_levels.SUCCESS, "Paused 1 worker.")]
    message_id = pgmb.send("order.created", {"order_id": 8})

    stats = dispatch()

    assert (stats.claimed, stats.delivered) == (0, 0)
    assert recording_server.requests == []
    assert Delivery.objects.filter(message_id=message_id, attempts=0).count() == 2

    resumed = post_action(admin_client, "worker", "resume_workers", [worker])
    assert reported(admin_client, resumed) == [(message_levels.SUCCESS, "Resumed 1 worker.")]

    stats = dispatch()

    assert stats.delivered == 2
    requests = recording_server.wait_for(2)
    assert sorted(r.headers["pgmb-queue"] for r in requests) == ["order_audit", "orders"]
    assert {r.headers["pgmb-message-id"] for r in requests} == {str(message_id)}
    assert not Delivery.objects.exists()
