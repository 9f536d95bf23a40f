"""A delivery cancelled while its request is in flight, with a real dispatcher process and a
real HTTP server that holds the request until the test has cancelled it: whatever the
worker answers is recorded as 'canceled', and the delivery is gone, neither retried nor
dead-lettered (docs/decisions/0084-cancel-and-run-now.md)."""

import threading

import pytest

import pgmb
from pgmb import deliveries
from pgmb.models import Attempt, DeadLetter, Delivery
from tests.httpserver import held


@pytest.mark.parametrize(
    ("status", "max_retries"),
    [(200, 3), (500, 3), (500, 0)],
    ids=["acked", "would-retry", "would-dead-letter"],
)
def test_a_request_in_flight_when_cancelled_ends_its_delivery(
    spawn, recording_server, make_worker, make_queue, status, max_retries
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
    dispatcher = spawn("--until-idle", "--poll-interval", "0.1")
    try:
        [request] = recording_server.wait_for(1)
        assert request.headers["pgmb-message-id"] == str(message_id)
        delivery = Delivery.objects.get(message_id=message_id)
        assert delivery.state == "leased"

        assert deliveries.cancel(delivery.pk) == deliveries.Canceled(removed=0, in_flight=1)
    finally:
        gate.set()
    assert dispatcher.wait(timeout=120) == 0, dispatcher.stderr.read()

    assert not Delivery.objects.exists()
    assert not DeadLetter.objects.exists()
    [attempt] = Attempt.objects.filter(message_id=message_id)
    assert (attempt.attempt, attempt.outcome, attempt.status_code) == (1, "canceled", status)
    assert attempt.error.startswith("canceled while its request was in flight")
    assert len(recording_server.requests) == 1
