"""Backfill… and Recover…, the queue list's actions over a window: the form, what they do,
their message with the counts and their log entries; bad windows change nothing; a user
without the permission is neither offered them nor allowed to POST them."""

from __future__ import annotations

import datetime as dt

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.utils import timezone

import pgmb
from pgmb.models import DeadLetter, Delivery, Queue

from .conftest import url


def post(client, action: str, queues, **extra):
    return client.post(
        url("queue_changelist"),
        {"action": action, "index": "0", "_selected_action": [str(q.pk) for q in queues], **extra},
    )


def window(hours_ago: float = 1, until_hours: float = 0.1) -> dict[str, str]:
    now = timezone.localtime()
    return {
        "since": (now - dt.timedelta(hours=hours_ago)).strftime("%Y-%m-%d %H:%M:%S"),
        "until": (now + dt.timedelta(hours=until_hours)).strftime("%Y-%m-%d %H:%M:%S"),
        "limit": "100",
    }


def shown(client, response) -> list[str]:
    return [str(m) for m in client.get(response["Location"]).context["messages"]]


def action_choices(client) -> set[str]:
    form = client.get(url("queue_changelist")).context["action_form"]
    return {name for name, _label in form.fields["action"].choices} if form else set()


def test_backfill_asks_for_a_window_then_gives_the_later_queue_its_messages(
    make_queue, admin_client
):
    make_queue("order.*", name="orders")
    ids = [pgmb.send("order.created", {"n": n}) for n in range(2)]
    audit = make_queue("order.#", name="audit")

    asked = post(admin_client, "backfill_queues", [audit])
    assert asked.status_code == 200
    assert "Backfill queues" in asked.content.decode()
    assert not Delivery.objects.filter(queue=audit).exists()

    done = post(admin_client, "backfill_queues", [audit], post="yes", **window())

    assert done.status_code == 302
    assert shown(admin_client, done) == ["Backfilled 2 messages (audit: 2)."]
    assert set(Delivery.objects.filter(queue=audit).values_list("message_id", flat=True)) == set(
        ids
    )
    [entry] = LogEntry.objects.all()
    assert (entry.object_id, entry.action_flag) == (str(audit.pk), CHANGE)
    assert entry.get_change_message().startswith("Backfilled messages published from ")
    again = post(admin_client, "backfill_queues", [audit], post="yes", **window())
    assert shown(admin_client, again) == ["Backfilled 0 messages (audit: 0)."]


def test_recover_requeues_the_windows_dead_letters(make_queue, admin_client):
    orders = make_queue("order.*", name="orders")
    message_id = pgmb.send("order.created", {"n": 1})
    Delivery.objects.all().delete()
    DeadLetter.objects.create(
        message_id=message_id, queue=orders, attempts=1, created_at=timezone.now()
    )

    done = post(admin_client, "recover_queues", [orders], post="yes", **window())

    assert shown(admin_client, done) == ["Recovered 1 dead letter (orders: 1)."]
    assert not DeadLetter.objects.exists()
    assert list(Delivery.objects.values_list("message_id", "attempts")) == [(message_id, 0)]


def test_a_backwards_window_is_refused_on_the_form_and_changes_nothing(make_queue, admin_client):
    make_queue("order.*", name="orders")
    pgmb.send("order.created", {"n": 1})
    audit = make_queue("order.#", name="audit")

    response = post(admin_client, "backfill_queues", [audit], post="yes", **window(-1, -2))

    assert response.status_code == 200
    assert "The window ends before it starts" in response.content.decode()
    assert not Delivery.objects.filter(queue=audit).exists()
    assert not LogEntry.objects.exists()


def test_staff_without_the_permissions_is_neither_offered_nor_allowed(
    client, django_user_model, make_queue
):
    orders = make_queue("order.*", name="orders")
    pgmb.send("order.created", {"n": 1})
    audit = make_queue("order.#", name="audit")
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_queue"))
    client.force_login(user)

    assert {"backfill_queues", "recover_queues"}.isdisjoint(action_choices(client))
    for action in ("backfill_queues", "recover_queues"):
        assert post(client, action, [audit]).status_code == 403
        assert post(client, action, [audit, orders], post="yes", **window()).status_code == 403
    assert not Delivery.objects.filter(queue=audit).exists()

    user.user_permissions.add(Permission.objects.get(codename="backfill_queue"))
    assert "backfill_queues" in action_choices(client)
    assert "recover_queues" not in action_choices(client)
    done = post(client, "backfill_queues", [audit], post="yes", **window())
    assert done.status_code == 302
    assert Delivery.objects.filter(queue=audit).count() == 1
    assert Queue.objects.count() == 2
