"""A queue's Fair shares page: it sets the fairness header and the keys' settings through
pgmb.fairness (what pgmb_queue and pgmb.fair_key store is asserted), logs each change,
refuses what the database refuses with the database's words on the form (nothing
changed), and is closed to staff without the queue's change permission (403 on GET and
every POST, nothing changed)."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission

from pgmb import fairness
from pgmb.admin import fair_shares

from .conftest import url

KEYS = (
    "SELECT k.key, k.weight, k.max_in_flight, k.rps FROM pgmb.fair_key k "
    "JOIN pgmb_queue q ON q.id = k.queue_id WHERE q.name = %s ORDER BY k.key"
)
HEADER = "SELECT fairness_header FROM pgmb_queue WHERE name = %s"


def page_url(queue) -> str:
    return url("queue_fair_shares", queue.pk)


def set_header(client, queue, header: str):
    return client.post(page_url(queue), {"_action": "header", "header-header": header})


def set_key(client, queue, key: str = "", **settings: str):
    fields = {"_action": "key", "key-key": key, "key-weight": "1"}
    fields.update({f"key-{name}": value for name, value in settings.items()})
    return client.post(page_url(queue), fields)


def shown(client, response) -> list[str]:
    assert response.status_code == 302, response.status_code
    return [str(m) for m in client.get(response["Location"]).context["messages"]]


def logged() -> list[str]:
    return [e.get_change_message() for e in LogEntry.objects.order_by("action_time", "pk")]


def test_the_queue_page_links_its_fair_shares(admin_client, make_queue):
    queue = make_queue("order.#", name="orders")
    page = admin_client.get(url("queue_change", queue.pk)).content.decode()
    assert f'href="{page_url(queue)}" id="pgmb-fair-shares"' in page

    shares = admin_client.get(page_url(queue))

    assert shares.status_code == 200
    assert "Off: claims take the queue's deliveries oldest first." in shares.content.decode()


def test_sets_the_header_and_a_keys_settings_and_logs_each(admin_client, make_queue, sql):
    queue = make_queue("order.#", name="orders")

    done = set_header(admin_client, queue, "tenant")

    assert shown(admin_client, done) == ["Set the fairness header to 'tenant'."]
    assert sql(HEADER, ("orders",)) == [("tenant",)]

    done = set_key(admin_client, queue, "acme", weight="3", max_in_flight="2", rps="5.5")

    assert shown(admin_client, done) == [
        "Set the fair share of key 'acme': weight 3, at most 2 in flight, 5.5 rps."
    ]
    assert sql(KEYS, ("orders",)) == [("acme", 3, 2, 5.5)]

    done = set_key(admin_client, queue, "acme", weight="2")  # empty cap and rate: lifted

    assert shown(admin_client, done) == ["Set the fair share of key 'acme': weight 2."]
    assert sql(KEYS, ("orders",)) == [("acme", 2, None, None)]
    assert logged() == [
        "Set the fairness header to 'tenant'.",
        "Set the fair share of key 'acme': weight 3, at most 2 in flight, 5.5 rps.",
        "Set the fair share of key 'acme': weight 2.",
    ]
    assert {(e.object_id, e.action_flag) for e in LogEntry.objects.all()} == {
        (str(queue.pk), CHANGE)
    }
    page = admin_client.get(page_url(queue)).content.decode()
    assert "Claims take the values of the header <code>tenant</code> in turn" in page
    assert 'value="tenant"' in page


def test_an_empty_header_turns_fairness_off(admin_client, make_queue, sql):
    queue = make_queue("order.#", name="orders")
    fairness.set_header("orders", "tenant")

    done = set_header(admin_client, queue, "")

    assert shown(admin_client, done) == ["Turned fairness off: oldest first."]
    assert sql(HEADER, ("orders",)) == [(None,)]
    again = set_header(admin_client, queue, "")
    assert shown(admin_client, again) == ["The fairness header was already that."]
    assert logged() == ["Turned fairness off: oldest first."]


def test_the_key_of_messages_without_the_header_is_set_by_its_box(admin_client, make_queue, sql):
    queue = make_queue("order.#", name="orders")

    done = set_key(admin_client, queue, without_header="on", weight="4")

    assert shown(admin_client, done) == ["Set the fair share of key '': weight 4."]
    assert sql(KEYS, ("orders",)) == [("", 4, None, None)]
    prefilled = admin_client.get(page_url(queue) + "?without_header=1")
    assert prefilled.context["key_form"].initial == {
        "key": "",
        "without_header": True,
        "weight": 4,
        "max_in_flight": None,
        "rps": None,
    }


def test_a_rows_change_link_fills_the_form_with_its_settings(admin_client, make_queue):
    queue = make_queue("order.#", name="orders")
    fairness.set_key("orders", "a&b", weight=7, rps=2.5)

    page = admin_client.get(page_url(queue)).content.decode()
    assert 'href="?key=a%26b#pgmb-key-form"' in page

    prefilled = admin_client.get(page_url(queue), {"key": "a&b"})
    assert prefilled.context["key_form"].initial == {
        "key": "a&b",
        "without_header": False,
        "weight": 7,
        "max_in_flight": None,
        "rps": 2.5,
    }


def test_removing_a_keys_settings_sets_it_back_to_the_defaults(admin_client, make_queue, sql):
    queue = make_queue("order.#", name="orders")
    fairness.set_header("orders", "tenant")
    fairness.set_key("orders", "acme", weight=5, max_in_flight=1, rps=3)
    fairness.set_key("orders", "other", weight=2)
    assert 'name="reset_key" value="acme"' in admin_client.get(page_url(queue)).content.decode()

    done = admin_client.post(page_url(queue), {"_action": "reset", "reset_key": "acme"})

    assert shown(admin_client, done) == [
        "Removed the settings of key 'acme': weight 1, no cap, no limit."
    ]
    assert sql(KEYS, ("orders",)) == [("acme", 1, None, None), ("other", 2, None, None)]
    assert logged() == ["Removed the settings of key 'acme': weight 1, no cap, no limit."]
    # A key at the defaults has nothing to remove: no button.
    assert 'name="reset_key" value="acme"' not in admin_client.get(page_url(queue)).content.decode()


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"weight": "0"}, "invalid weight 0: a whole number from 1 to 1000"),
        ({"weight": "-2"}, "invalid weight -2: a whole number from 1 to 1000"),
        ({"weight": "1001"}, "invalid weight 1001: a whole number from 1 to 1000"),
        ({"max_in_flight": "0"}, "invalid max_in_flight 0: at least 1 (NULL: no cap)"),
        ({"rps": "-1"}, "invalid rps -1: a positive, finite number (NULL: no limit)"),
        ({"rps": "0"}, "invalid rps 0: a positive, finite number (NULL: no limit)"),
    ],
)
def test_a_setting_the_database_refuses_is_the_forms_error(
    admin_client, make_queue, sql, settings, error
):
    queue = make_queue("order.#", name="orders")
    fairness.set_key("orders", "acme", weight=2)

    response = set_key(admin_client, queue, "acme", **settings)

    assert response.status_code == 200
    assert response.context["key_form"].non_field_errors() == [f"Nothing changed: {error}"]
    assert sql(KEYS, ("orders",)) == [("acme", 2, None, None)]
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize(
    ("fields", "field", "error"),
    [
        ({"key": ""}, "key", "Name a key."),
        ({"key": "acme", "without_header": "on"}, "key", "Either name a key or tick"),
        ({"key": "acme", "weight": "two"}, "weight", "Enter a whole number."),
        ({"key": "acme", "weight": str(2**31)}, "weight", "less than or equal to 2147483647"),
        ({"key": "acme", "rps": "inf"}, "rps", "Enter a number."),
    ],
)
def test_a_form_that_names_no_key_or_no_number_changes_nothing(
    admin_client, make_queue, sql, fields, field, error
):
    queue = make_queue("order.#", name="orders")

    response = set_key(admin_client, queue, **fields)

    assert response.status_code == 200
    assert error in " ".join(response.context["key_form"].errors[field])
    assert sql(KEYS, ("orders",)) == []
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize(
    "header",
    ["has blank", " tenant", "x" * 256, "tab\there"],
)
def test_a_header_the_database_refuses_is_the_forms_error(admin_client, make_queue, sql, header):
    queue = make_queue("order.#", name="orders")
    fairness.set_header("orders", "tenant")

    response = set_header(admin_client, queue, header)

    assert response.status_code == 200
    [error] = response.context["header_form"].non_field_errors()
    assert error.startswith(f"Nothing changed: invalid fairness header '{header[:20]}")
    assert error.endswith("1 to 255 characters without blanks or control characters")
    assert sql(HEADER, ("orders",)) == [("tenant",)]
    assert not LogEntry.objects.exists()


def test_staff_without_the_change_permission_gets_403_and_changes_nothing(
    client, django_user_model, make_queue, sql
):
    queue = make_queue("order.#", name="orders")
    fairness.set_header("orders", "tenant")
    fairness.set_key("orders", "acme", weight=2)
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_queue"))
    client.force_login(user)

    change_page = client.get(url("queue_change", queue.pk))
    assert change_page.status_code == 200
    assert "pgmb-fair-shares" not in change_page.content.decode()
    assert "keys of header tenant in turn: acme: weight 2" in change_page.content.decode()
    assert client.get(page_url(queue)).status_code == 403
    assert set_header(client, queue, "").status_code == 403
    assert set_key(client, queue, "acme", weight="9").status_code == 403
    reset = client.post(page_url(queue), {"_action": "reset", "reset_key": "acme"})
    assert reset.status_code == 403
    assert sql(HEADER, ("orders",)) == [("tenant",)]
    assert sql(KEYS, ("orders",)) == [("acme", 2, None, None)]
    assert not LogEntry.objects.exists()

    user.user_permissions.add(Permission.objects.get(codename="change_queue"))
    assert client.get(page_url(queue)).status_code == 200
    assert shown(client, set_key(client, queue, "acme", weight="9")) == [
        "Set the fair share of key 'acme': weight 9."
    ]
    assert sql(KEYS, ("orders",)) == [("acme", 9, None, None)]


def test_a_visitor_not_logged_in_is_sent_to_the_login_page(client, make_queue, sql):
    queue = make_queue("order.#", name="orders")

    response = set_header(client, queue, "tenant")

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    assert sql(HEADER, ("orders",)) == [(None,)]


def test_an_unknown_queue_or_action_is_refused(admin_client, make_queue, sql):
    queue = make_queue("order.#", name="orders")
    missing = url("queue_fair_shares", "00000000-0000-0000-0000-000000000000")
    assert admin_client.get(missing).status_code == 404
    assert (
        admin_client.post(missing, {"_action": "header", "header-header": "x"}).status_code == 404
    )
    assert admin_client.post(page_url(queue), {"_action": "drop"}).status_code == 400
    assert sql(HEADER, ("orders",)) == [(None,)]


def test_a_queue_with_many_keys_lists_the_first_in_turn(admin_client, make_queue, sql):
    queue = make_queue("order.#", name="orders")
    sql(
        "INSERT INTO pgmb.fair_key (queue_id, key) "
        "SELECT %s, 'k' || lpad(n::text, 4, '0') FROM generate_series(1, %s) n",
        (queue.pk, fair_shares.KEYS_SHOWN + 2),
    )

    response = admin_client.get(page_url(queue))

    assert [row["key"].key for row in response.context["keys"]] == [
        f"k{n:04d}" for n in range(1, fair_shares.KEYS_SHOWN + 1)
    ]
    assert "2 more keys, later in turn, are not listed" in response.content.decode()
