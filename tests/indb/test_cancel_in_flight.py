"""The in-database loop's side of a delivery cancelled while its request is in flight: the
server holds the request until the test has cancelled it; the answer, 200 or 500, is
recorded as 'canceled', and the delivery is gone, neither retried nor dead-lettered
(docs/decisions/0084-cancel-and-run-now.md)."""

import threading

import pytest

import pgmb
from pgmb import deliveries
from pgmb.models import Attempt, DeadLetter, Delivery
from tests.httpserver import held
from tests.waiting import wait_until


@pytest.mark.parametrize(("status", "max_retries"), [(200, 3), (500, 3), (500, 0)])
def test_a_request_in_flight_when_cancelled_ends_its_delivery(
    pg, transport, start_loop, recording_server, make_worker, make_queue, status, max_retries
):
    gate = threading.Event()
    recording_server.respond(held(gate, status=status, body="answer"))
    make_queue(
        "#",
        worker=make_worker(endpoint=recording_server.url(), timeout=60),
        max_retries=max_retries,
        lease_seconds=600,
    )
    message_id = pgmb.send("order.created", {"n": 1})
    start_loop()
    try:
        [request] = recording_server.wait_for(1)
        assert request.headers["pgmb-message-id"] == str(message_id)
        delivery = Delivery.objects.get(message_id=message_id)
        assert delivery.state == "leased"

        assert deliveries.cancel(delivery.pk) == deliveries.Canceled(removed=0, in_flight=1)
    finally:
        gate.set()
    wait_until(
        lambda: Attempt.objects.filter(message_id=message_id).exists(),
        message="the outcome of the request",
    )

    assert not Delivery.objects.exists()
    assert not DeadLetter.objects.exists()
    [attempt] = Attempt.objects.filter(message_id=message_id)
    assert (attempt.attempt, attempt.outcome, attempt.status_code) == (1, "canceled", status)
    assert len(recording_server.requests) == 1
