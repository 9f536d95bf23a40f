"""Cancelling live deliveries and making them due now from the admin: the actions, the
buttons of a delivery's page, permissions (403 and no button without them), log entries
and messages (docs/decisions/0084-cancel-and-run-now.md)."""

import re
import uuid

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType

import pgmb
from pgmb import deliveries
from pgmb.models import Attempt, Delivery, Queue

from .conftest import url

ACTIONS = {"cancel_selected", "run_now_selected"}


@pytest.fixture
def backlog(make_queue):
    """orders: two delayed deliveries and one leased."""
    orders = make_queue("order.*", name="orders")
    leased_id = pgmb.send("order.leased", {"n": 0})
    [claim] = deliveries.claim(["orders"], 1)
    delayed = [pgmb.send("order.later", {"n": n}, delay=3600) for n in (1, 2)]
    return {
        "queue": orders,
        "leased": Delivery.objects.get(message_id=leased_id),
        "claim": claim,
        "delayed": [Delivery.objects.get(message_id=m) for m in delayed],
    }


def staff_client(client, django_user_model, *codenames):
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__in=ContentType.objects.get_for_models(Queue, Delivery).values(),
            codename__in=["view_delivery", "view_queue", *codenames],
        )
    )
    client.force_login(user)
    return client


def post_action(client, action, selected, **extra):
    data = {"action": action, "_selected_action": [str(o.pk) for o in selected], **extra}
    if "post" not in extra:
        data["index"] = "0"
    return client.post(url("delivery_changelist"), data)


def action_choices(client) -> set[str]:
    response = client.get(url("delivery_changelist"))
    assert response.status_code == 200
    form = response.context["action_form"]
    return {name for name, _label in form.fields["action"].choices} if form else set()


def shown_messages(client, response) -> list[str]:
    assert response.status_code == 302, response.status_code
    return [str(m) for m in client.get(response["Location"]).context["messages"]]


def logged() -> list[tuple[int, str, str]]:
    return [
        (e.action_flag, e.object_id, e.get_change_message())
        for e in LogEntry.objects.order_by("object_id", "action_flag")
    ]


def test_cancel_asks_then_cancels_logs_and_reports(admin_client, backlog):
    selected = [backlog["leased"], *backlog["delayed"]]

    asked = post_action(admin_client, "cancel_selected", selected)
    assert asked.status_code == 200
    assert "Cancel 3 deliveries?" in asked.content.decode()
    assert Delivery.objects.count() == 3  # asking changes nothing

    done = post_action(admin_client, "cancel_selected", selected, post="yes")

    assert shown_messages(admin_client, done) == [
        "Cancelled 3 deliveries. 1 in flight: each ends when its request's outcome comes, "
        "recorded as cancelled."
    ]
    assert list(Delivery.objects.values_list("pk", flat=True)) == [backlog["leased"].pk]
    assert Delivery.objects.get().canceled_at is not None
    assert logged() == sorted(
        [
            (DELETION, str(d.pk), "Cancelled: deleted, never posted again.")
            for d in backlog["delayed"]
        ]
        + [
            (
                CHANGE,
                str(backlog["leased"].pk),
                "Cancelled in flight: ends when its request's outcome comes.",
            )
        ]
    )
    # Again: nothing left to cancel, said so.
    again = post_action(admin_client, "cancel_selected", [backlog["leased"]], post="yes")
    assert shown_messages(admin_client, again) == [
        "Cancelled 0 deliveries. The others had finished or were cancelled already."
    ]


def test_run_now_makes_them_due_logs_and_reports(admin_client, backlog):
    selected = [backlog["leased"], *backlog["delayed"]]

    done = post_action(admin_client, "run_now_selected", selected)

    assert shown_messages(admin_client, done) == [
        "Made 2 deliveries due now. The others were due already, leased or finished."
    ]
    claimed = {uuid.UUID(c.message_id) for c in deliveries.claim(["orders"], 10)}
    assert claimed == {d.message_id for d in backlog["delayed"]}
    assert logged() == sorted((CHANGE, str(d.pk), "Run now: due now.") for d in backlog["delayed"])


def test_staff_without_the_permissions_gets_no_action_no_button_and_403(
    client, django_user_model, backlog
):
    staff = staff_client(client, django_user_model)

    assert action_choices(staff) & ACTIONS == set()
    page = staff.get(url("delivery_change", backlog["delayed"][0].pk)).content.decode()
    assert 'id="pgmb-cancel"' not in page and 'id="pgmb-run-now"' not in page
    for action, extra in [("cancel_selected", {"post": "yes"}), ("run_now_selected", {})]:
        assert post_action(staff, action, backlog["delayed"], **extra).status_code == 403
    assert Delivery.objects.count() == 3
    assert not Attempt.objects.exists()
    assert not LogEntry.objects.exists()


def test_each_permission_grants_its_own_action_and_button(client, django_user_model, backlog):
    staff = staff_client(client, django_user_model, "run_delivery")

    assert action_choices(staff) & ACTIONS == {"run_now_selected"}
    page = staff.get(url("delivery_change", backlog["delayed"][0].pk)).content.decode()
    assert 'id="pgmb-run-now"' in page and 'id="pgmb-cancel"' not in page
    refused = post_action(staff, "cancel_selected", backlog["delayed"], post="yes")
    assert refused.status_code == 403
    assert Delivery.objects.count() == 3


def test_buttons_only_where_they_apply(admin_client, backlog):
    leased = admin_client.get(url("delivery_change", backlog["leased"].pk)).content.decode()
    # Running already: cancel only.
    assert 'id="pgmb-cancel"' in leased and 'id="pgmb-run-now"' not in leased
    deliveries.cancel(backlog["leased"].pk)
    marked = admin_client.get(url("delivery_change", backlog["leased"].pk)).content.decode()
    assert 'id="pgmb-cancel"' not in marked and 'id="pgmb-run-now"' not in marked
    assert "leased, cancelled" in marked


def test_the_buttons_of_a_deliverys_page_post_its_actions(client, django_user_model, backlog):
    operator = staff_client(client, django_user_model, "cancel_delivery", "run_delivery")
    target = backlog["delayed"][0]
    page = operator.get(url("delivery_change", target.pk)).content.decode()

    def form_of(button_id):
        form = page[page.rindex("<form", 0, page.index(f'id="{button_id}"')) :]
        fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', form[: form.index("</form>")]))
        return re.search(r'action="([^"]+)"', form).group(1), fields

    action, fields = form_of("pgmb-run-now")
    assert operator.post(action, fields).status_code == 302
    assert [uuid.UUID(c.message_id) for c in deliveries.claim(["orders"], 10)] == [
        target.message_id
    ]

    other = backlog["delayed"][1]
    page = operator.get(url("delivery_change", other.pk)).content.decode()
    action, fields = form_of("pgmb-cancel")
    asked = operator.post(action, fields)
    assert asked.status_code == 200 and "Yes, cancel them" in asked.content.decode()
    assert operator.post(action, {**fields, "post": "yes"}).status_code == 302
    assert not Delivery.objects.filter(pk=other.pk).exists()
    assert Attempt.objects.get(message_id=other.message_id).outcome == "canceled"
