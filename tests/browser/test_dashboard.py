"""The dashboard, in a real browser: reached from the admin index, it shows the charts and
the tables of queues, workers and dispatchers after real traffic."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from playwright.sync_api import expect

import pgmb
from pgmb.models import Attempt, Delivery
from tests.httpserver import reply
from tests.waiting import wait_until

from .conftest import log_in, screenshot

pytestmark = pytest.mark.browser


def test_the_dashboard_is_linked_from_the_index_and_shows_charts_and_tables(
    page, live_server, operator, spawn, recording_server, make_worker, make_queue
):
    make_queue(
        "order.*",
        name="orders",
        worker=make_worker(name="orders_service", endpoint=recording_server.url("/orders")),
    )
    make_queue(
        "email.*",
        name="emails",
        worker=make_worker(name="mailer", endpoint=recording_server.url("/emails")),
        max_retries=0,
    )
    # The mailer fails one message in four, so the charts have failures and dead letters.
    recording_server.respond(
        lambda record: reply(502, "smtp relay down") if record.json()["n"] % 4 == 0 else 200,
        path="/emails",
    )
    pgmb.send_batch(("order.created", {"n": n}) for n in range(30))
    pgmb.send_batch(("email.sent", {"n": n}) for n in range(20))
    pgmb.send("invoice.created", {"n": 0})  # unrouted: no queue binds invoice.*
    dispatcher = spawn("--poll-interval", "0.05")  # left running: the dashboard lists it
    wait_until(
        lambda: Attempt.objects.count() == 50 and not Delivery.objects.exists(),
        message=lambda: f"50 attempts ({Attempt.objects.count()} so far)",
    )

    log_in(page, operator)
    page.get_by_role("link", name="Dashboard").click()

    expect(page).to_have_url(
        re.compile(re.escape(live_server.url + reverse("admin:pgmb_dashboard")))
    )
    expect(page.locator("svg.pgmb-chart").first).to_be_visible()
    expect(page.locator("#pgmb-queues")).to_contain_text("orders")
    expect(page.locator("#pgmb-queues")).to_contain_text("emails")
    expect(page.locator("#pgmb-workers")).to_contain_text("orders_service")
    expect(page.locator("#pgmb-workers")).to_contain_text("mailer")
    expect(page.locator("#pgmb-dispatchers")).to_contain_text(str(dispatcher.pid))
    screenshot(page, "dashboard")
