"""An operator hastens one delayed delivery and cancels another from their pages, in a real
browser, with a dispatcher running: the one run now is delivered at once, the cancelled
one never (docs/decisions/0084-cancel-and-run-now.md)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

import pgmb
from pgmb.models import Attempt, Delivery
from tests.waiting import wait_until

from .conftest import log_in, screenshot

pytestmark = pytest.mark.browser


def test_run_now_and_cancel_from_a_deliverys_page(
    page, operator, spawn, recording_server, make_worker, make_queue
):
    make_queue(
        "order.*",
        name="orders",
        worker=make_worker(name="orders_service", endpoint=recording_server.url("/orders")),
    )
    hastened = pgmb.send("order.created", {"n": 1}, delay=3600)
    doomed = pgmb.send("order.created", {"n": 2}, delay=3600)
    spawn("--poll-interval", "0.05")
    hastened_pk = Delivery.objects.get(message_id=hastened).pk
    doomed_pk = Delivery.objects.get(message_id=doomed).pk

    log_in(page, operator, then=f"/admin/pgmb/delivery/{hastened_pk}/change/")
    expect(page.locator(".field-status")).to_contain_text("delayed")
    expect(page.locator("#pgmb-cancel")).to_be_visible()
    screenshot(page, "delivery-page")
    page.locator("#pgmb-run-now").click()

    expect(page.locator(".messagelist .success")).to_have_text("Made 1 delivery due now.")
    wait_until(
        lambda: Attempt.objects.filter(message_id=hastened, outcome="ack").exists(),
        message="the delivery made due now to be delivered",
    )

    page.goto(f"/admin/pgmb/delivery/{doomed_pk}/change/")
    page.locator("#pgmb-cancel").click()
    expect(page.locator(".pgmb-question")).to_contain_text("Cancel 1 delivery?")
    screenshot(page, "cancel-confirmation")
    page.get_by_role("button", name="Yes, cancel them").click()

    expect(page.locator(".messagelist .success")).to_have_text("Cancelled 1 delivery.")
    assert not Delivery.objects.exists()
    assert list(Attempt.objects.filter(message_id=doomed).values_list("outcome", flat=True)) == [
        "canceled"
    ]
    assert [r.json()["n"] for r in recording_server.requests] == [1]
