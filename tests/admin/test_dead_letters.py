"""Requeueing and purging dead letters from the admin: the actions, their confirmation
pages, permissions, log entries, messages and query counts."""

import re

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import pgmb
from pgmb import deliveries
from pgmb.models import DeadLetter, Delivery, Message, Queue

from .conftest import url

DEAD_LETTER_ACTIONS = {"requeue_selected", "requeue_queues", "purge_selected"}
WHOLE_QUEUE = "Requeued every dead letter of the queue: %s."


def kill(message_id, queue, status=500):
    """Move a live delivery to the dead letters, as the state machine would."""
    Delivery.objects.filter(message_id=message_id, queue=queue).delete()
    return DeadLetter.objects.create(
        message_id=message_id,
        queue=queue,
        attempts=queue.max_retries + 1,
        last_status=status,
        created_at=timezone.now(),
    )


@pytest.fixture
def dead(make_queue):
    """Two queues: orders with three dead letters, audit with two."""
    orders = make_queue("order.*", name="orders", max_retries=1)
    audit = make_queue("audit.*", name="audit", max_retries=0)
    return {
        "orders": orders,
        "audit": audit,
        "order_letters": [kill(pgmb.send("order.created", {"n": n}), orders) for n in range(3)],
        "audit_letters": [kill(pgmb.send("audit.seen", {"n": n}), audit) for n in range(2)],
    }


def post_action(client, action, selected, model="deadletter", **extra):
    data = {"action": action, "_selected_action": [str(o.pk) for o in selected], **extra}
    if "post" not in extra:
        data["index"] = "0"  # the changelist's own action form (the confirmation has none)
    return client.post(url(f"{model}_changelist"), data)


def action_choices(client, model="deadletter") -> set[str]:
    response = client.get(url(f"{model}_changelist"))
    assert response.status_code == 200
    form = response.context["action_form"]  # None when no action is offered
    return {name for name, _label in form.fields["action"].choices} if form else set()


def shown_messages(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def follow(client, response):
    assert response.status_code == 302, response.status_code
    return client.get(response["Location"])


def live_deliveries():
    return set(Delivery.objects.values_list("message_id", "queue__name", "attempts", "state"))


def dead_ids():
    return set(DeadLetter.objects.values_list("pk", flat=True))


def logged(action_flag=None):
    entries = LogEntry.objects.order_by("object_id")
    if action_flag is not None:
        entries = entries.filter(action_flag=action_flag)
    return [(e.content_type.model, e.object_id, e.get_change_message()) for e in entries]


# --- superuser: the actions ---------------------------------------------------------------


def test_a_superuser_is_offered_the_actions(admin_client, dead):
    assert action_choices(admin_client) >= DEAD_LETTER_ACTIONS
    assert "requeue_dead_letters" in action_choices(admin_client, "queue")
    assert "delete_selected" not in action_choices(admin_client)


def test_requeue_selected_moves_them_back_logs_and_reports(admin_client, dead):
    chosen = [*dead["order_letters"][:2], dead["audit_letters"][0]]

    response = post_action(admin_client, "requeue_selected", chosen)

    page = follow(admin_client, response)
    assert shown_messages(page) == ["Requeued 3 dead letters."]
    assert "Requeued 3 dead letters." in page.content.decode()
    assert dead_ids() == {dead["order_letters"][2].pk, dead["audit_letters"][1].pk}
    assert live_deliveries() == {
        (letter.message_id, letter.queue.name, 0, "ready") for letter in chosen
    }
    assert logged() == [
        ("deadletter", str(letter.pk), "Requeued: due again on its queue, attempts from 0.")
        for letter in sorted(chosen, key=lambda letter: str(letter.pk))
    ]
    assert {e.action_flag for e in LogEntry.objects.all()} == {CHANGE}


def test_requeue_of_one_says_one(admin_client, dead):
    response = post_action(admin_client, "requeue_selected", dead["audit_letters"][:1])

    assert shown_messages(follow(admin_client, response)) == ["Requeued 1 dead letter."]


def test_requeue_selected_is_one_state_machine_call_whatever_the_selection(
    admin_client, make_queue
):
    queue = make_queue("order.*", name="orders")
    letters = [kill(pgmb.send("order.created", {"n": n}), queue) for n in range(30)]

    def run(selected):
        with CaptureQueriesContext(connection) as captured:
            response = post_action(admin_client, "requeue_selected", selected)
        assert response.status_code == 302
        return [q["sql"] for q in captured.captured_queries]

    run(letters[:1])  # warm up: the session, the content type cache
    few = run(letters[1:3])
    many = run(letters[3:])

    assert len(many) == len(few)
    for statements in (few, many):
        assert sum("pgmb.requeue(" in sql for sql in statements) == 1
        assert not any(
            re.match(r'\s*(DELETE FROM|UPDATE|INSERT INTO) "pgmb_', sql) for sql in statements
        )
    assert not DeadLetter.objects.exists()
    assert Delivery.objects.count() == 30
    assert LogEntry.objects.count() == 30


def test_purge_asks_first_then_yes_purges(admin_client, dead):
    chosen = [*dead["order_letters"][:2], dead["audit_letters"][0]]

    page = post_action(admin_client, "purge_selected", chosen)

    assert page.status_code == 200
    assert page.templates[0].name == "admin/pgmb/dead_letter_action_confirmation.html"
    html = page.content.decode()
    assert "Delete 3 dead letters for good?" in html
    assert "<li>audit: 1 dead letter</li>" in html
    assert "<li>orders: 2 dead letters</li>" in html
    assert str(chosen[0].message_id) in html
    assert 'value="Yes, purge them"' in html
    assert len(dead_ids()) == 5  # nothing happened yet
    assert not LogEntry.objects.exists()

    # "Yes" posts the page's own form back.
    hidden = dict(re.findall(r'<input type="hidden" name="(action|post)" value="([^"]*)"', html))
    assert hidden == {"action": "purge_selected", "post": "yes"}
    selected = re.findall(r'name="_selected_action" value="(\d+)"', html)
    assert sorted(selected) == sorted(str(letter.pk) for letter in chosen)
    response = admin_client.post(
        url("deadletter_changelist"), {**hidden, "_selected_action": selected}
    )

    page = follow(admin_client, response)
    assert shown_messages(page) == ["Purged 3 dead letters."]
    assert dead_ids() == {dead["order_letters"][2].pk, dead["audit_letters"][1].pk}
    assert not Delivery.objects.exists()
    assert Message.objects.count() == 5  # the messages stay
    assert logged(DELETION) == [
        ("deadletter", str(letter.pk), "Purged: the dead letter was deleted.")
        for letter in sorted(chosen, key=lambda letter: str(letter.pk))
    ]


def test_purge_no_changes_nothing(admin_client, dead):
    page = post_action(admin_client, "purge_selected", dead["order_letters"])

    back = re.search(r'<a href="([^"]+)" class="button cancel-link">No, take me back</a>',
                     page.content.decode())  # fmt: skip
    assert back is not None
    assert back.group(1) == url("deadletter_changelist")
    response = admin_client.get(back.group(1))

    assert response.status_code == 200
    assert len(dead_ids()) == 5
    assert not LogEntry.objects.exists()
    assert shown_messages(response) == []


def test_the_confirmation_keeps_the_changelist_filters(admin_client, dead):
    filtered = f"{url('deadletter_changelist')}?queue__id__exact={dead['orders'].pk}"
    data = {
        "action": "purge_selected",
        "index": "0",
        "_selected_action": [str(o.pk) for o in dead["order_letters"]],
    }

    page = admin_client.post(filtered, data)

    assert page.status_code == 200
    assert f'<a href="{filtered}" class="button cancel-link">' in page.content.decode()
    assert len(dead_ids()) == 5


def test_requeue_queues_from_the_dead_letters_asks_then_requeues_whole_queues(admin_client, dead):
    chosen = dead["order_letters"][:1]  # one letter of orders: all three go

    page = post_action(admin_client, "requeue_queues", chosen)

    assert page.status_code == 200
    html = page.content.decode()
    assert "Requeue all 3 dead letters of 1 queue?" in html
    assert "<li>orders: 3 dead letters</li>" in html
    assert "audit" not in html.split('id="content"', 1)[1]
    assert len(dead_ids()) == 5

    response = post_action(admin_client, "requeue_queues", chosen, post="yes")

    page = follow(admin_client, response)
    assert shown_messages(page) == ["Requeued 3 dead letters of orders."]
    assert dead_ids() == {letter.pk for letter in dead["audit_letters"]}
    assert {(m, q) for m, q, _a, _s in live_deliveries()} == {
        (letter.message_id, "orders") for letter in dead["order_letters"]
    }
    assert logged() == [("queue", str(dead["orders"].pk), WHOLE_QUEUE % "3 dead letters")]


def test_queue_admin_requeues_the_dead_letters_of_the_selected_queues(
    admin_client, dead, make_queue
):
    empty = make_queue("nothing.*", name="empty")
    queues = [dead["orders"], dead["audit"], empty]

    page = post_action(admin_client, "requeue_dead_letters", queues, model="queue")

    assert page.status_code == 200
    html = page.content.decode()
    assert "Requeue all 5 dead letters of 3 queues?" in html
    for line in ("audit: 2 dead letters", "empty: 0 dead letters", "orders: 3 dead letters"):
        assert f"<li>{line}</li>" in html
    assert len(dead_ids()) == 5

    # "No": back to the queue list, nothing changed.
    assert f'<a href="{url("queue_changelist")}" class="button cancel-link">' in html
    assert admin_client.get(url("queue_changelist")).status_code == 200
    assert len(dead_ids()) == 5

    response = post_action(admin_client, "requeue_dead_letters", queues, model="queue", post="yes")

    page = follow(admin_client, response)
    assert shown_messages(page) == ["Requeued 5 dead letters of audit, empty, orders."]
    assert not DeadLetter.objects.exists()
    assert Delivery.objects.count() == 5
    assert sorted(logged()) == sorted(
        [
            ("queue", str(dead["orders"].pk), WHOLE_QUEUE % "3 dead letters"),
            ("queue", str(dead["audit"].pk), WHOLE_QUEUE % "2 dead letters"),
            ("queue", str(empty.pk), WHOLE_QUEUE % "0 dead letters"),
        ]
    )


# --- staff without the permissions ----------------------------------------------------------


def staff_client(client, django_user_model, *codenames):
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__in=ContentType.objects.get_for_models(Queue, DeadLetter).values(),
            codename__in=["view_deadletter", "view_queue", *codenames],
        )
    )
    client.force_login(user)
    return client


def test_staff_without_the_permissions_is_not_offered_the_actions(client, django_user_model, dead):
    staff = staff_client(client, django_user_model)

    assert action_choices(staff) & DEAD_LETTER_ACTIONS == set()
    assert "requeue_dead_letters" not in action_choices(staff, "queue")
    assert 'name="_selected_action"' not in staff.get(url("deadletter_changelist")).content.decode()


@pytest.mark.parametrize(
    ("model", "action"),
    [
        ("deadletter", "requeue_selected"),
        ("deadletter", "requeue_queues"),
        ("deadletter", "purge_selected"),
        ("queue", "requeue_dead_letters"),
    ],
)
@pytest.mark.parametrize("confirmed", [False, True])
def test_staff_without_the_permissions_is_refused(
    client, django_user_model, dead, model, action, confirmed
):
    staff = staff_client(client, django_user_model)
    selected = (
        [dead["orders"], dead["audit"]]
        if model == "queue"
        else dead["order_letters"] + dead["audit_letters"]
    )
    extra = {"post": "yes"} if confirmed else {}

    response = post_action(staff, action, selected, model=model, **extra)

    assert response.status_code == 403  # no confirmation page, no change
    assert len(dead_ids()) == 5
    assert not Delivery.objects.exists()
    assert not LogEntry.objects.exists()


def test_each_permission_grants_its_own_actions(client, django_user_model, dead):
    staff = staff_client(client, django_user_model, "requeue_deadletter")

    assert action_choices(staff) & DEAD_LETTER_ACTIONS == {"requeue_selected", "requeue_queues"}
    assert "requeue_dead_letters" in action_choices(staff, "queue")
    refused = post_action(staff, "purge_selected", dead["order_letters"], post="yes")
    assert refused.status_code == 403
    assert len(dead_ids()) == 5

    response = post_action(staff, "requeue_selected", dead["order_letters"])

    assert shown_messages(follow(staff, response)) == ["Requeued 3 dead letters."]
    assert len(dead_ids()) == 2


def test_purge_permission_alone_grants_the_purge(client, django_user_model, dead):
    staff = staff_client(client, django_user_model, "purge_deadletter")

    assert action_choices(staff) & DEAD_LETTER_ACTIONS == {"purge_selected"}
    assert "requeue_dead_letters" not in action_choices(staff, "queue")
    response = post_action(staff, "purge_selected", dead["audit_letters"], post="yes")

    assert shown_messages(follow(staff, response)) == ["Purged 2 dead letters."]
    assert dead_ids() == {letter.pk for letter in dead["order_letters"]}


def die_twice(queue, body, headers):
    """A message that fails twice on ``queue`` (max_retries 1) through the state machine:
    503, then 410 and a long error; returns its dead letter."""
    message_id = pgmb.send("order.created", body, headers=headers)
    for status, error in ((503, "maintenance"), (410, "gone: " + "x" * 100 + "\nsecond line")):
        Delivery.objects.filter(message_id=message_id).update(available_at=timezone.now())
        [claimed] = deliveries.claim([queue.name], 1)
        deliveries.fail([deliveries.Failure(claimed.delivery_id, claimed.lease_id, status, error)])
    return DeadLetter.objects.get(message_id=message_id)


def test_a_dead_letters_page_shows_its_message_and_every_attempt(
    client, django_user_model, make_queue, make_worker
):
    orders = make_queue(
        "order.*", name="orders", max_retries=1, worker=make_worker(name="orders_service")
    )
    letter = die_twice(orders, {"order": 7, "lines": [1, 2]}, {"tenant": "acme"})
    viewer = staff_client(client, django_user_model)

    page = viewer.get(url("deadletter_change", letter.pk)).content.decode()

    # Titled by its queue's name, not its uuid.
    assert f"{letter.message_id} ✗ orders" in page
    assert str(orders.id) not in page
    assert "orders_service" in page
    assert "order.created" in page
    assert "&quot;order&quot;: 7" in page and "&quot;tenant&quot;: &quot;acme&quot;" in page
    timeline = page[page.index('class="pgmb-timeline"') :]
    rows = re.findall(r"<tr><td>(\d+)</td><td>([^<]+)</td><td>(\d*)</td>", timeline)
    assert rows == [("1", "will retry", "503"), ("2", "dead-lettered", "410")]
    assert "maintenance" in timeline and "second line" in timeline
    # Viewing is not requeueing: no button without the permission.
    assert 'id="pgmb-requeue"' not in page


def test_the_requeue_button_of_a_dead_letters_page_requeues_it(
    client, django_user_model, make_queue
):
    orders = make_queue("order.*", name="orders", max_retries=1)
    letter = die_twice(orders, {"order": 8}, {})
    operator = staff_client(client, django_user_model, "requeue_deadletter")
    page = operator.get(url("deadletter_change", letter.pk)).content.decode()
    form = page[page.rindex("<form", 0, page.index('id="pgmb-requeue"')) :]
    fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', form[: form.index("</form>")]))
    action = re.search(r'action="([^"]+)"', form).group(1)

    response = operator.post(action, fields)

    assert response.status_code == 302
    assert not DeadLetter.objects.filter(pk=letter.pk).exists()
    assert live_deliveries() == {(letter.message_id, "orders", 0, "ready")}
    [entry] = LogEntry.objects.filter(action_flag=CHANGE)
    assert entry.object_repr == f"{letter.message_id} ✗ orders"


def test_the_dead_letter_list_cuts_long_errors_to_one_line(client, django_user_model, make_queue):
    orders = make_queue("order.*", name="orders", max_retries=1)
    letter = die_twice(orders, {"order": 9}, {})
    viewer = staff_client(client, django_user_model)

    page = viewer.get(url("deadletter_changelist")).content.decode()

    # The whole error is the cut line's tooltip (and on the dead letter's page).
    assert f'<span title="{letter.last_error}">gone: {"x" * 54}…</span>' in page
