"""An operator sets a queue's fairness header and a key's settings from the queue's page,
in a real browser, and pgmb_queue and pgmb.fair_key store them; a weight the database
refuses comes back on the form, nothing changed (docs/fairness.md)."""

from __future__ import annotations

import pytest
from django.db import connection
from playwright.sync_api import expect

import pgmb

from .conftest import log_in, screenshot

pytestmark = pytest.mark.browser


def stored(queue: str) -> tuple[str | None, list[tuple]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT fairness_header FROM pgmb_queue WHERE name = %s", [queue])
        [(header,)] = cursor.fetchall()
        cursor.execute(
            "SELECT k.key, k.weight, k.max_in_flight, k.rps FROM pgmb.fair_key k "
            "JOIN pgmb_queue q ON q.id = k.queue_id WHERE q.name = %s ORDER BY k.key",
            [queue],
        )
        return header, cursor.fetchall()


def test_set_a_header_and_a_keys_weight_from_the_queues_page(page, operator, make_queue):
    queue = make_queue("order.*", name="orders")
    log_in(page, operator, then=f"/admin/pgmb/queue/{queue.pk}/change/")
    expect(page.locator(".field-fair_shares")).to_contain_text("off: oldest first")
    page.locator("#pgmb-fair-shares").click()

    page.locator("#id_header-header").fill("tenant")
    page.get_by_role("button", name="Save the header").click()
    expect(page.locator(".messagelist .success")).to_have_text(
        "Set the fairness header to 'tenant'."
    )
    assert stored("orders") == ("tenant", [])

    # Deliveries of two tenants make their keys; one of them gets a share of its own.
    pgmb.send("order.created", {"n": 1}, headers={"tenant": "acme"})
    pgmb.send("order.created", {"n": 2}, headers={"tenant": "globex"})
    page.reload()
    page.locator("#id_key-key").fill("acme")
    page.locator("#id_key-weight").fill("0")
    page.get_by_role("button", name="Save the key").click()
    expect(page.locator("#pgmb-key-form .errorlist")).to_contain_text(
        "Nothing changed: invalid weight 0: a whole number from 1 to 1000"
    )
    assert stored("orders") == ("tenant", [("acme", 1, None, None), ("globex", 1, None, None)])

    page.locator("#id_key-weight").fill("3")
    page.locator("#id_key-max_in_flight").fill("2")
    page.get_by_role("button", name="Save the key").click()
    expect(page.locator(".messagelist .success")).to_have_text(
        "Set the fair share of key 'acme': weight 3, at most 2 in flight."
    )
    assert stored("orders") == ("tenant", [("acme", 3, 2, None), ("globex", 1, None, None)])
    expect(page.locator("#pgmb-fair-keys tbody tr")).to_have_count(2)
    screenshot(page, "fair-shares")

    page.locator(".breadcrumbs a", has_text=queue.name).click()
    expect(page.locator(".field-fair_shares")).to_contain_text(
        "keys of header tenant in turn: acme: weight 3, 2 in flight at most"
    )
