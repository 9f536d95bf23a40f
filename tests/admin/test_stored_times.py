"""The message and delivery lists show any stored time (pgmb.admin.stored_times).

Issue 26: a message sent with ``'infinity'::timestamptz`` made the message and delivery
lists answer 500 for every user: no ``datetime`` holds infinity or the year 294276. pgmb
refuses such times now; rows stored before (here: written with the triggers disabled, as
0.1.0 stored them) still show, for a staff user with view permissions only.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.db import connection

import pgmb
from pgmb.models import Delivery

from .conftest import table_rows, url

STORED = {
    "available_at": ["infinity", "294276-12-31 23:59:59+00", "-infinity"],
    "created_at": ["-infinity", "4713-01-01 00:00:00+00 BC", "9999-12-30 23:30:00+00"],
}


@pytest.fixture
def viewer(client, django_user_model):
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["view_message", "view_delivery"])
    )
    client.force_login(user)
    return client


@pytest.fixture
def stored_before_the_rule(make_queue):
    """Three messages (and their deliveries) whose times no datetime holds."""
    make_queue("order.#")
    ids = [pgmb.send("order.created", {"n": n}) for n in range(3)]
    with connection.cursor() as cursor:
        # As 0.1.0 stored them: the checks of the times are triggers (rolled back with the test).
        cursor.execute("ALTER TABLE pgmb_message DISABLE TRIGGER USER")
        cursor.execute("ALTER TABLE pgmb_delivery DISABLE TRIGGER USER")
        for n, mid in enumerate(ids):
            for table, key in (("pgmb_message", "id"), ("pgmb_delivery", "message_id")):
                cursor.execute(
                    f"UPDATE {table} SET available_at = %s::timestamptz,"
                    f" created_at = %s::timestamptz WHERE {key} = %s",
                    [STORED["available_at"][n], STORED["created_at"][n], mid],
                )
        cursor.execute("ALTER TABLE pgmb_message ENABLE TRIGGER USER")
        cursor.execute("ALTER TABLE pgmb_delivery ENABLE TRIGGER USER")
    return ids


def test_the_message_list_shows_every_stored_time(viewer, stored_before_the_rule):
    response = viewer.get(url("message_changelist"))
    assert response.status_code == 200
    rows = table_rows(response)
    assert len(rows) == 3
    page = response.content.decode()
    for shown in ("infinity", "294276-12-31", "-infinity", "4713-01-01", "BC", "Dec. 30, 9999"):
        assert shown in page, shown
    # Sorting by the creation time still works: by the stored value.
    assert viewer.get(url("message_changelist") + "?o=3").status_code == 200


def test_a_messages_page_shows_its_stored_times(viewer, stored_before_the_rule):
    for mid in stored_before_the_rule:
        response = viewer.get(url("message_change", mid))
        assert response.status_code == 200
    assert "294276-12-31" in response.content.decode() or "infinity" in response.content.decode()


def test_the_delivery_list_shows_every_stored_time_and_status(viewer, stored_before_the_rule):
    response = viewer.get(url("delivery_changelist"))
    assert response.status_code == 200
    rows = table_rows(response)
    assert len(rows) == Delivery.objects.count() == 3
    statuses = [row.split('class="field-status">', 1)[1].split("<", 1)[0] for row in rows]
    # Due at infinity and in the year 294276: delayed; at -infinity: ready.
    assert statuses == ["delayed", "delayed", "ready"]
    page = response.content.decode()
    assert "infinity" in page and "294276-12-31" in page and "4713-01-01" in page
