"""Operational events with the in-database loop: the same SQL announces a dead delivery
and a breaker's opening and closing to the worker of a queue bound to ``pgmb.#``, posted by
the loop itself, on each transport."""

from __future__ import annotations

import pgmb
from pgmb.models import DeadLetter, Message


def _posted(server, path: str) -> list[dict]:
    return [r.json() for r in server.requests if r.path == path]


def test_the_loop_posts_a_dead_deliverys_event_and_none_about_the_event(
    transport, dispatch_until, recording_server, make_worker, make_queue, events_on
):
    recording_server.respond(503, "down", path="/orders")
    recording_server.respond(500, path="/events")
    orders = make_worker(endpoint=recording_server.url("/orders"))
    make_queue("order.*", name="orders", worker=orders, max_retries=0)
    events = make_worker(endpoint=recording_server.url("/events"))
    make_queue("pgmb.#", name="events", worker=events, max_retries=0)
    message_id = pgmb.send("order.created", {"n": 1})

    dispatch_until(lambda: DeadLetter.objects.count() == 2, "the order's and its event's deaths")

    [event] = _posted(recording_server, "/events")
    assert event == {
        "queue": "orders",
        "worker": orders.name,
        "message_id": str(message_id),
        "routing_key": "order.created",
        "attempts": 1,
        "last_status": 503,
        "last_error": "HTTP 503: down",
    }
    # The event's own death announced nothing.
    assert Message.objects.filter(routing_key__startswith="pgmb.").count() == 1


def test_the_loop_posts_a_breaker_opening_and_closing(
    transport, dispatch_until, recording_server, make_worker, make_queue, events_on
):
    recording_server.script([500], path="/orders")
    orders = make_worker(
        endpoint=recording_server.url("/orders"),
        breaker_failures=1,
        breaker_cooldown=0.2,
        breaker_cooldown_max=0.2,
    )
    make_queue("order.*", name="orders", worker=orders, backoff_base=0.05, backoff_max=0.1)
    events = make_worker(endpoint=recording_server.url("/events"))
    make_queue("pgmb.#", name="events", worker=events)
    pgmb.send_batch([("order.created", n) for n in range(5)])

    dispatch_until(
        lambda: len(_posted(recording_server, "/events")) >= 2, "the breaker's two events"
    )

    states = [(e["worker"], e["state"]) for e in _posted(recording_server, "/events")]
    assert states == [(orders.name, "open"), (orders.name, "closed")]
