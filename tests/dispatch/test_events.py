"""Operational events with the external dispatcher, against real endpoints on loopback: a
delivery that dies and a breaker that opens and closes are posted to the worker of a queue
bound to ``pgmb.#``; nothing when events are off; never an event about an event; several
dispatchers killing and announcing at once, every event once."""

from __future__ import annotations

import asyncio

import pgmb
from pgmb.db.conninfo import conninfo_from_django
from pgmb.dispatch.engine import Dispatcher, Options
from pgmb.models import DeadLetter, Message


def _posted(server, path: str) -> list[dict]:
    return [r.json() for r in server.requests if r.path == path]


def _events_queue(make_worker, make_queue, server, **kw):
    worker = make_worker(endpoint=server.url("/events"))
    return make_queue("pgmb.#", name="events", worker=worker, **kw)


def test_a_dead_delivery_is_posted_to_the_events_queue(
    dispatch, recording_server, make_worker, make_queue, events_on
):
    recording_server.respond(503, "down", path="/orders")
    orders = make_worker(endpoint=recording_server.url("/orders"))
    make_queue("order.*", name="orders", worker=orders, max_retries=1, backoff_base=0.01)
    _events_queue(make_worker, make_queue, recording_server)
    message_id = pgmb.send("order.created", {"n": 1})

    dispatch(concurrency=1)

    assert DeadLetter.objects.count() == 1
    assert _posted(recording_server, "/events") == [
        {
            "queue": "orders",
            "worker": orders.name,
            "message_id": str(message_id),
            "routing_key": "order.created",
            "attempts": 2,
            "last_status": 503,
            "last_error": "HTTP 503: down",
        }
    ]


def test_nothing_is_posted_when_events_are_off(dispatch, recording_server, make_worker, make_queue):
    recording_server.respond(503, path="/orders")
    orders = make_worker(endpoint=recording_server.url("/orders"))
    make_queue("order.*", name="orders", worker=orders, max_retries=0)
    _events_queue(make_worker, make_queue, recording_server)
    pgmb.send("order.created", {"n": 1})

    dispatch(concurrency=1)

    assert DeadLetter.objects.count() == 1
    assert _posted(recording_server, "/events") == []
    assert not Message.objects.filter(routing_key__startswith="pgmb.").exists()


def test_the_events_own_dead_delivery_publishes_nothing(
    dispatch, recording_server, make_worker, make_queue, events_on
):
    recording_server.respond(503, path="/orders")
    recording_server.respond(500, path="/events")
    orders = make_worker(endpoint=recording_server.url("/orders"))
    make_queue("order.*", name="orders", worker=orders, max_retries=0)
    _events_queue(make_worker, make_queue, recording_server, max_retries=0)
    pgmb.send("order.created", {"n": 1})

    dispatch(concurrency=1)

    assert DeadLetter.objects.count() == 2  # the order's delivery, then its event's
    assert len(_posted(recording_server, "/events")) == 1
    assert Message.objects.filter(routing_key__startswith="pgmb.").count() == 1


def test_a_breaker_opening_and_closing_is_posted(
    dispatch, recording_server, make_worker, make_queue, events_on
):
    # One failure opens it; then 200, the default: the probe closes it.
    recording_server.script([500], path="/orders")
    orders = make_worker(
        endpoint=recording_server.url("/orders"),
        breaker_failures=1,
        breaker_cooldown=0.2,
        breaker_cooldown_max=0.2,
    )
    make_queue("order.*", name="orders", worker=orders, backoff_base=0.05, backoff_max=0.1)
    _events_queue(make_worker, make_queue, recording_server)
    pgmb.send_batch([("order.created", n) for n in range(5)])

    dispatch(concurrency=1, batch=1)

    events = [(e["worker"], e["state"]) for e in _posted(recording_server, "/events")]
    assert events == [(orders.name, "open"), (orders.name, "closed")]
    assert _posted(recording_server, "/events")[1]["reason"] == "the probe succeeded (HTTP 200)"


def test_several_dispatchers_announce_every_death_once(
    transactional_db, recording_server, make_worker, make_queue, events_on
):
    recording_server.respond(503, path="/orders")
    orders = make_worker(endpoint=recording_server.url("/orders"))
    make_queue("order.*", name="orders", worker=orders, max_retries=0)
    make_queue("order.#", name="audit", worker=orders, max_retries=0)
    _events_queue(make_worker, make_queue, recording_server)
    ids = pgmb.send_batch([("order.created", n) for n in range(150)])

    async def main() -> None:
        conninfo = conninfo_from_django("default")
        options = Options(until_idle=True, max_seconds=120, poll_interval=0.05, concurrency=8)
        await asyncio.gather(*(Dispatcher(conninfo, options).run() for _ in range(3)))

    asyncio.run(main())

    assert DeadLetter.objects.count() == 300
    posted = _posted(recording_server, "/events")
    assert sorted((e["message_id"], e["queue"]) for e in posted) == sorted(
        (str(i), q) for i in ids for q in ("orders", "audit")
    )
