"""An operator gets dead letters delivered from the admin, in a real browser: messages die
at a broken endpoint under a running dispatcher, the endpoint recovers, the operator
requeues from the dead-letter list, and the same dispatcher delivers them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
from playwright.sync_api import Page, expect

import pgmb
from pgmb.models import Attempt, DeadLetter, Delivery, Queue
from tests.httpserver import Record, RecordingServer, reply
from tests.waiting import wait_until

from .conftest import log_in, screenshot

pytestmark = pytest.mark.browser

CHANGELIST = "/admin/pgmb/deadletter/"
REQUEUE_SELECTED = "Requeue selected dead letters"
REQUEUE_QUEUES = "Requeue every dead letter of the selected letters' queues"
PURGE_SELECTED = "Purge selected dead letters"

# How the broken endpoint answers each message (by its "n"), until it recovers.
FAILURES = {
    1: reply(500, "database is down"),
    2: reply(503, "maintenance until 14:00"),
    3: reply(404, "no such order"),
    4: reply(500, "audit log full"),
}


@dataclass
class DeadLetters:
    orders: Queue
    audit: Queue
    by_n: dict[int, uuid.UUID]  # message ids, by the "n" of their payload

    def letter_pk(self, n: int) -> int:
        return DeadLetter.objects.get(message_id=self.by_n[n]).pk


@pytest.fixture
def dead_letters(spawn, recording_server, make_worker, make_queue) -> DeadLetters:
    """Four dead letters, made the way production makes them: a dispatcher (a real
    process, left running) meets a broken endpoint. Three on "orders" (500, 503, 404),
    one on "audit". The endpoint then recovers: it answers 200 from here on."""
    orders = make_queue(
        "order.*",
        name="orders",
        worker=make_worker(name="orders_service", endpoint=recording_server.url("/orders")),
        max_retries=0,
    )
    audit = make_queue(
        "audit.*",
        name="audit",
        worker=make_worker(name="auditor", endpoint=recording_server.url("/audit")),
        max_retries=0,
    )
    recording_server.respond(lambda record: FAILURES[record.json()["n"]])
    by_n = {n: pgmb.send("order.created", {"n": n}) for n in (1, 2, 3)}
    by_n[4] = pgmb.send("audit.seen", {"n": 4})
    spawn("--poll-interval", "0.05")
    wait_until(
        lambda: DeadLetter.objects.count() == 4,
        message=lambda: f"4 dead letters ({DeadLetter.objects.count()} so far)",
    )
    recording_server.respond(200)
    return DeadLetters(orders=orders, audit=audit, by_n=by_n)


def delivered(server: RecordingServer) -> list[Record]:
    """The requests the recovered endpoint answered with 200."""
    return [r for r in server.requests if r.reply is not None and r.reply.status == 200]


def acked(message_ids: list[uuid.UUID]) -> bool:
    return Attempt.objects.filter(message_id__in=message_ids, outcome="ack").count() == len(
        message_ids
    )


def rows(page: Page):
    return page.locator("#result_list tbody tr")


def select_letters(page: Page, *pks: int) -> None:
    for pk in pks:
        page.locator(f'input[name="_selected_action"][value="{pk}"]').check()


def run_action(page: Page, label: str) -> None:
    page.locator('select[name="action"]').select_option(label=label)
    page.get_by_role("button", name="Go").click()


def test_requeue_a_dead_letter_from_its_list_and_see_it_delivered(
    page, operator, dead_letters, recording_server
):
    log_in(page, operator)
    page.goto(CHANGELIST)
    expect(rows(page)).to_have_count(4)
    expect(page.locator("#result_list")).to_contain_text("maintenance until 14:00")
    screenshot(page, "dead-letters")
    chosen = dead_letters.by_n[2]  # the 503

    select_letters(page, dead_letters.letter_pk(2))
    run_action(page, REQUEUE_SELECTED)

    # Requeueing a selection is not destructive: done at once, no confirmation page.
    expect(page.locator(".messagelist .success")).to_have_text("Requeued 1 dead letter.")
    expect(rows(page)).to_have_count(3)
    screenshot(page, "dead-letters-requeued")
    wait_until(lambda: acked([chosen]), message="the requeued message to be acked")
    (request,) = delivered(recording_server)
    assert request.path == "/orders"
    assert request.headers["pgmb-message-id"] == str(chosen)
    assert request.headers["pgmb-attempt"] == "1"  # attempts start again
    assert request.json() == {"n": 2}
    assert list(
        Attempt.objects.filter(message_id=chosen)
        .order_by("id")
        .values_list("outcome", "status_code")
    ) == [("dead", 503), ("ack", 200)]
    assert set(DeadLetter.objects.values_list("message_id", flat=True)) == {
        dead_letters.by_n[n] for n in (1, 3, 4)
    }
    assert not Delivery.objects.exists()


def test_read_a_dead_letter_on_its_page_requeue_it_there_and_see_it_delivered(
    page, operator, dead_letters, recording_server
):
    chosen = dead_letters.by_n[3]  # the 404
    log_in(page, operator)
    page.goto(CHANGELIST)
    page.locator("#result_list tbody tr", has_text="no such order").locator("th a").click()

    # The page says which queue and worker, shows the message and its attempt.
    expect(page.locator("#content h2")).to_have_text(f"{chosen} ✗ orders")
    expect(page.locator(".field-worker_name")).to_contain_text("orders_service")
    expect(page.locator(".field-body")).to_contain_text('"n": 3')
    timeline = page.locator(".pgmb-timeline tbody tr")
    expect(timeline).to_have_count(1)
    expect(timeline).to_contain_text("dead-lettered")
    expect(timeline).to_contain_text("404")
    screenshot(page, "dead-letter-page")

    page.locator("#pgmb-requeue").click()

    expect(page.locator(".messagelist .success")).to_have_text("Requeued 1 dead letter.")
    expect(rows(page)).to_have_count(3)
    wait_until(lambda: acked([chosen]), message="the requeued message to be acked")
    (request,) = delivered(recording_server)
    assert request.json() == {"n": 3}
    assert not DeadLetter.objects.filter(message_id=chosen).exists()


def test_requeue_a_whole_queue_after_confirming_and_see_it_delivered(
    page, operator, dead_letters, recording_server
):
    orders = [dead_letters.by_n[n] for n in (1, 2, 3)]
    log_in(page, operator)
    page.goto(CHANGELIST)

    select_letters(page, dead_letters.letter_pk(3))  # one letter stands for its queue
    run_action(page, REQUEUE_QUEUES)

    expect(page.locator(".pgmb-question")).to_have_text(
        "Requeue all 3 dead letters of 1 queue? They become due now, their attempts counted from 0."
    )
    expect(page.locator(".pgmb-groups")).to_have_text("orders: 3 dead letters")
    screenshot(page, "requeue-confirmation")
    assert DeadLetter.objects.count() == 4  # nothing happens before "Yes"
    page.get_by_role("button", name="Yes, requeue them").click()

    expect(page.locator(".messagelist .success")).to_have_text("Requeued 3 dead letters of orders.")
    expect(rows(page)).to_have_count(1)
    expect(rows(page)).to_contain_text("audit")
    wait_until(lambda: acked(orders), message="the orders queue's messages to be acked")
    requests = delivered(recording_server)
    assert sorted(r.json()["n"] for r in requests) == [1, 2, 3]
    assert {r.headers["pgmb-message-id"] for r in requests} == {str(m) for m in orders}
    assert {r.path for r in requests} == {"/orders"}
    assert list(DeadLetter.objects.values_list("message_id", flat=True)) == [dead_letters.by_n[4]]
    assert not Delivery.objects.exists()


def test_a_staff_user_without_the_requeue_permission_is_not_offered_requeue(
    page, make_staff, dead_letters
):
    viewer = make_staff("viewer", "view_deadletter", "purge_deadletter")
    log_in(page, viewer)
    page.goto(CHANGELIST)
    expect(rows(page)).to_have_count(4)

    choices = page.locator('select[name="action"] option')
    expect(choices).to_contain_text([PURGE_SELECTED])  # the dropdown is there...
    labels = choices.all_inner_texts()
    assert REQUEUE_SELECTED not in labels  # ...without either requeue
    assert REQUEUE_QUEUES not in labels
    screenshot(page, "dead-letters-without-requeue-permission")
