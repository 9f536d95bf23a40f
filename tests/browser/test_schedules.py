"""An operator adds a schedule in the admin, in a real browser: a bad cron expression is a
form error and stores nothing, the corrected form is saved through pgmb.schedule (the next
run is the cron rule's), the schedule is changed to an interval, and a dispatcher (a real
process) fires it: its page shows the next run and the last runs with their messages
(docs/decisions/0092-schedules-edited-in-the-admin.md)."""

from __future__ import annotations

import datetime

import pytest
from playwright.sync_api import expect

from pgmb import schedules
from pgmb.models import Message, Schedule
from tests.waiting import wait_until

from .conftest import log_in, screenshot

pytestmark = pytest.mark.browser


def test_add_a_schedule_see_a_bad_cron_refused_change_it_and_see_it_fire(page, operator, spawn):
    log_in(page, operator, then="/admin/pgmb/schedule/add/")
    page.locator("#id_name").fill("nightly-report")
    page.locator("#id_cron").fill("30 25 * * *")
    page.locator("#id_timezone").fill("Europe/Berlin")
    page.locator("#id_missed").select_option("skip")
    page.locator("#id_routing_key").fill("report.nightly")
    page.locator("#id_body").fill('{"kind": "daily"}')
    page.locator("#id_headers").fill('{"x-team": "reports"}')
    page.get_by_role("button", name="Save and continue editing").click()

    expect(page.locator(".field-cron .errorlist")).to_contain_text(
        'bad cron expression "30 25 * * *": bad hour'
    )
    assert not Schedule.objects.exists()
    screenshot(page, "schedule-bad-cron")

    page.locator("#id_cron").fill("30 2 * * *")
    page.get_by_role("button", name="Save and continue editing").click()
    expect(page.locator(".messagelist .success")).to_contain_text("was added successfully")
    added = Schedule.objects.get()
    assert (added.name, added.cron, added.timezone, added.missed) == (
        "nightly-report",
        "30 2 * * *",
        "Europe/Berlin",
        "skip",
    )
    assert (added.body, added.headers, added.paused) == (
        {"kind": "daily"},
        {"x-team": "reports"},
        False,
    )
    assert added.next_run_at == schedules.cron_next("30 2 * * *", "Europe/Berlin", added.created_at)
    expect(page.locator(".field-next_run")).to_contain_text(
        added.next_run_at.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    )

    # Changed to every second, with another body: a dispatcher then fires it.
    page.locator("#id_cron").fill("")
    page.locator("#id_every").fill("1")
    page.locator("#id_body").fill('{"kind": "live"}')
    page.get_by_role("button", name="Save and continue editing").click()
    expect(page.locator(".messagelist .success")).to_contain_text("was changed successfully")
    changed = Schedule.objects.get()
    assert (changed.pk, changed.cron, changed.every, changed.body) == (
        added.pk,
        None,
        datetime.timedelta(seconds=1),
        {"kind": "live"},
    )

    spawn("--poll-interval", "0.05")
    fired = wait_until(
        lambda: (s := Schedule.objects.get()).runs >= 2 and s,
        message="the dispatcher to fire the schedule twice",
    )
    page.reload()
    runs = page.locator(".field-last_runs_listed li")
    expect(runs.first).to_contain_text("message")
    newest = fired.last_runs[0]
    message = Message.objects.get(pk=schedules.message_id(fired.pk, newest))
    assert (message.routing_key, message.body) == ("report.nightly", {"kind": "live"})
    assert message.headers.get("x-team") == "reports"
    screenshot(page, "schedule-page")
