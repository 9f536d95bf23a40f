"""End to end: a message fails until it is dead-lettered, the worker recovers, an operator
requeues the dead letter from the admin, and a dispatcher delivers it."""

from django.contrib.admin.models import LogEntry
from django.urls import reverse

import pgmb
from pgmb.models import Attempt, DeadLetter, Delivery


def test_a_dead_letter_requeued_from_the_admin_is_delivered(
    dispatch, recording_server, make_worker, make_queue, admin_client
):
    worker = make_worker(endpoint=recording_server.url("/hook"))
    queue = make_queue("order.*", name="orders", worker=worker, max_retries=0)
    recording_server.respond(500, "broken")
    message_id = pgmb.send("order.created", {"order_id": 7})

    stats = dispatch()

    assert (stats.delivered, stats.failed) == (0, 1)
    (letter,) = DeadLetter.objects.all()
    assert (letter.message_id, letter.queue_id, letter.last_status) == (message_id, queue.pk, 500)
    assert not Delivery.objects.exists()

    recording_server.respond(200)
    response = admin_client.post(
        reverse("admin:pgmb_deadletter_changelist"),
        {"action": "requeue_selected", "index": "0", "_selected_action": [str(letter.pk)]},
        follow=True,
    )
    assert "Requeued 1 dead letter." in response.content.decode()
    assert LogEntry.objects.filter(object_id=str(letter.pk)).count() == 1

    stats = dispatch()

    assert stats.delivered == 1
    first, second = recording_server.wait_for(2)
    for request in (first, second):
        assert request.path == "/hook"
        assert request.headers["pgmb-message-id"] == str(message_id)
        assert request.headers["pgmb-attempt"] == "1"  # attempts start again
        assert request.json() == {"order_id": 7}
    assert not DeadLetter.objects.exists()
    assert not Delivery.objects.exists()
    assert list(
        Attempt.objects.filter(message_id=message_id)
        .order_by("id")
        .values_list("outcome", "status_code")
    ) == [("dead", 500), ("ack", 200)]
