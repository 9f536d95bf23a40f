"""Every page of pgmb's admin, as a staff user who may only view it (issue 26, item 9: a
user with ``view_queue`` alone got a 500 on a queue's page).

Each model's list and one object's page are opened by a real staff user holding only that
model's ``view_`` permission: every page answers 200, shows no form field to edit, and the
worker's page shows neither its secret nor its endpoint's password.
"""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.utils import timezone

import pgmb
from pgmb.models import (
    Attempt,
    DeadLetter,
    Delivery,
    Message,
    Queue,
    Worker,
)

from .conftest import url

PASSWORD = "s3cret-pass"
SECRET = "whsec_dmlldy1vbmx5LXVzZXJzLXNlY3JldA=="


@pytest.fixture
def one_of_each(make_worker, make_queue):
    """One object of each model the admin lists: a worker with a secret and credentials in
    its endpoint, its queue, a message with a delivery, a dead letter, an attempt."""
    worker = make_worker(endpoint=f"http://alice:{PASSWORD}@127.0.0.1:9/hook", secret=SECRET)
    queue = make_queue("order.*", name="orders", worker=worker)
    live = pgmb.send("order.created", {"n": 1})
    dead = pgmb.send("order.created", {"n": 2})
    Delivery.objects.filter(message_id=dead).delete()
    now = timezone.now()
    DeadLetter.objects.create(message_id=dead, queue=queue, attempts=1, last_status=500,
                              created_at=now)  # fmt: skip
    Attempt.objects.create(message_id=dead, queue=queue, attempt=1, outcome="dead",
                           status_code=500, created_at=now)  # fmt: skip
    return {
        Worker: worker,
        Queue: queue,
        Message: Message.objects.get(pk=live),
        Delivery: Delivery.objects.get(message_id=live),
        DeadLetter: DeadLetter.objects.get(message_id=dead),
        Attempt: Attempt.objects.get(message_id=dead),
    }


def viewer(client, django_user_model, model) -> None:
    """Log ``client`` in as a staff user whose only permission is to view ``model``."""
    user = django_user_model.objects.create_user(
        f"viewer_{model._meta.model_name}", password="pw", is_staff=True
    )
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="pgmb", codename=f"view_{model._meta.model_name}"
        )
    )
    client.force_login(user)


PGMB_ADMINS = sorted(
    (m for m in admin.site._registry if m._meta.app_label == "pgmb"),
    key=lambda m: m._meta.model_name,
)


@pytest.mark.parametrize("model", PGMB_ADMINS, ids=lambda m: m._meta.model_name)
def test_a_view_only_user_opens_the_list_and_a_page(client, django_user_model, one_of_each, model):
    viewer(client, django_user_model, model)
    name = model._meta.model_name

    listing = client.get(url(f"{name}_changelist"))
    assert listing.status_code == 200, (name, listing.status_code)

    obj = one_of_each.get(model)
    if obj is None:  # the dashboard, the dispatchers (none ran): the list is the page
        return
    page = client.get(url(f"{name}_change", obj.pk))
    assert page.status_code == 200, (name, page.status_code)
    html = page.content.decode()
    inputs = set(re.findall(r'<(?:input|select|textarea)[^>]*name="([^"]+)"', html))
    assert inputs <= {"csrfmiddlewaretoken"}, (name, inputs)  # nothing to edit
    assert PASSWORD not in html and SECRET not in html


def test_a_view_only_user_opens_a_queue(client, django_user_model, make_queue):
    """Issue 26, item 9, as reported: view_queue alone, a queue's page."""
    queue = make_queue("order.*", name="orders")
    viewer(client, django_user_model, Queue)

    page = client.get(url("queue_change", queue.pk))

    assert page.status_code == 200
    assert "pgmb.orders_queue" in page.content.decode()  # its views are named read-only
    assert client.post(url("queue_change", queue.pk), {"name": "renamed"}).status_code == 403
    assert Queue.objects.get(pk=queue.pk).name == "orders"
