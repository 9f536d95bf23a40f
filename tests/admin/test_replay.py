"""Replaying messages from the admin: the confirmation page, the action's message and log
entries, its permission, and end to end with a dispatcher and a real local server."""

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType

import pgmb
from pgmb.models import Attempt, Delivery, Message

from .conftest import url


def post_replay(client, messages, **extra):
    return client.post(
        url("message_changelist"),
        {
            "action": "replay_messages",
            "index": "0",
            "_selected_action": [str(m) for m in messages],
            **extra,
        },
    )


def action_choices(client) -> set[str]:
    response = client.get(url("message_changelist"))
    assert response.status_code == 200
    form = response.context["action_form"]
    return {name for name, _label in form.fields["action"].choices} if form else set()


def test_a_message_replayed_from_the_admin_is_delivered_again(
    dispatch, recording_server, make_worker, make_queue, admin_client
):
    worker = make_worker(endpoint=recording_server.url("/hook"))
    make_queue("order.*", name="orders", worker=worker)
    make_queue("order.#", name="audit", worker=make_worker(endpoint=recording_server.url("/audit")))
    message_id = pgmb.send("order.created", {"order_id": 7})
    assert dispatch().delivered == 2
    recording_server.wait_for(2)

    asked = post_replay(admin_client, [message_id])

    assert asked.status_code == 200  # the confirmation page, nothing done yet
    page = asked.content.decode()
    assert "Replay 1 message?" in page and "creates 2 deliveries" in page
    assert "audit: 1 message" in page and "orders: 1 message" in page
    assert not Delivery.objects.exists()

    done = post_replay(admin_client, [message_id], post="yes")

    assert done.status_code == 302
    shown = [str(m) for m in admin_client.get(done["Location"]).context["messages"]]
    assert shown == ["Replayed 1 message: 2 deliveries created."]
    [entry] = LogEntry.objects.all()
    assert (entry.object_id, entry.action_flag) == (str(message_id), CHANGE)
    assert entry.get_change_message() == "Replayed to the queues that acknowledged it."

    assert dispatch().delivered == 2
    requests = recording_server.wait_for(4)[2:]
    assert sorted(r.path for r in requests) == ["/audit", "/hook"]
    for request in requests:
        assert request.headers["pgmb-message-id"] == str(message_id)
        assert request.headers["pgmb-attempt"] == "1"
        assert request.json() == {"order_id": 7}
    assert Attempt.objects.filter(message_id=message_id, outcome="ack").count() == 4
    assert not Delivery.objects.exists()


def test_replaying_what_nothing_acked_warns(make_queue, admin_client):
    make_queue("order.*", name="orders")
    message_id = pgmb.send("order.created", {"n": 1})  # live, never delivered

    response = post_replay(admin_client, [message_id], post="yes")

    shown = [str(m) for m in admin_client.get(response["Location"]).context["messages"]]
    assert shown == ["Replayed 1 message: 0 deliveries created."]
    assert Delivery.objects.count() == 1


def test_staff_without_the_permission_is_neither_offered_nor_allowed(
    client, django_user_model, make_queue
):
    make_queue("order.*", name="orders")
    message_id = pgmb.send("order.created", {"n": 1})
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type=ContentType.objects.get_for_model(Message), codename="view_message"
        )
    )
    client.force_login(user)

    assert "replay_messages" not in action_choices(client)
    assert post_replay(client, [message_id]).status_code == 403
    assert post_replay(client, [message_id], post="yes").status_code == 403
    assert Delivery.objects.count() == 1

    user.user_permissions.add(Permission.objects.get(codename="replay_message"))
    assert "replay_messages" in action_choices(client)
