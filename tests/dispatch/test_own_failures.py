"""What a producer's routing key and pgmb's own failures do to a worker, with the external
dispatcher against a real endpoint on loopback: a key with any Unicode letter reaches the
worker percent-encoded in ``pgmb-routing-key``, and a request pgmb cannot build or may not
send is the delivery's failed attempt, never the endpoint's (its circuit breaker does not
hear of it)."""

from __future__ import annotations

import uuid
from urllib.parse import unquote

import pgmb
from pgmb.dispatch.client import OWN_FAILURE
from pgmb.models import Attempt, DeadLetter, Delivery, Worker
from tests.stored_rows import store_with_triggers_off

SEND = "SELECT pgmb.send(%s, %s, %s::jsonb)"

#: Keys of a producer's messages, and the header each reaches the worker with.
KEYS = {
    "c.zoé": b"c.zo%C3%A9",
    "c.€": b"c.%E2%82%AC",
    "c.注文": b"c.%E6%B3%A8%E6%96%87",
    "c.100%": b"c.100%25",
    "c.ok": b"c.ok",
}


def test_a_producers_unicode_routing_keys_reach_the_worker_and_never_open_its_breaker(
    dispatch, recording_server, make_worker, make_queue, login_role
):
    worker = make_worker(
        endpoint=recording_server.url("/hook"),
        breaker_failures=3,
        breaker_cooldown=3600,
        breaker_cooldown_max=3600,
    )
    make_queue("c.#", worker=worker)
    _, producer = login_role("pgmb_producer")
    sent = {}
    for n, key in enumerate([*KEYS, "c.zoé", "c.€", "c.ok", "c.ok"]):
        message_id = uuid.uuid4()
        producer.execute(SEND, (message_id, key, str(n)))
        sent[str(message_id)] = key

    dispatch()

    assert not Delivery.objects.exists()
    assert Attempt.objects.filter(outcome="ack").count() == len(sent)
    assert Worker.objects.get(pk=worker.pk).breaker_state == "closed"
    received = {}
    for record in recording_server.requests:
        # aiohttp hands a header's bytes over as UTF-8 with surrogateescape: these are them.
        raw = record.headers["pgmb-routing-key"].encode("utf-8", "surrogateescape")
        received[record.headers["pgmb-message-id"]] = raw
    assert received == {m: KEYS[key] for m, key in sent.items()}
    assert {m: unquote(raw.decode("ascii")) for m, raw in received.items()} == sent


def test_a_request_pgmb_cannot_build_is_the_deliverys_failure_not_the_endpoints(
    dispatch, recording_server, make_worker, make_queue
):
    worker = make_worker(
        endpoint=recording_server.url("/hook"),
        breaker_failures=1,
        breaker_cooldown=3600,
        breaker_cooldown_max=3600,
    )
    make_queue("#", worker=worker, max_retries=1, backoff_base=0, backoff_max=0)
    # A secret the rules refuse today, stored as an older database may hold it: no request
    # of this worker can be signed.
    store_with_triggers_off("UPDATE pgmb_worker SET secret = 'whsec_a' WHERE id = %s", (worker.pk,))
    unbuildable = {str(i) for i in pgmb.send_batch(("k", n) for n in range(3))}

    dispatch()

    assert recording_server.requests == []
    assert {str(m) for m in DeadLetter.objects.values_list("message", flat=True)} == unbuildable
    errors = list(Attempt.objects.values_list("status_code", "error"))
    assert len(errors) == 6  # two attempts each: retried, then dead-lettered
    assert all(
        status is None and error.startswith(OWN_FAILURE + "could not send the request: ")
        for status, error in errors
    )
    w = Worker.objects.get(pk=worker.pk)
    assert (w.breaker_state, w.breaker_streak, w.breaker_requests) == ("closed", 0, 0)

    # The worker's next messages go out: nothing held them back.
    Worker.objects.filter(pk=worker.pk).update(secret="")
    valid = {str(i) for i in pgmb.send_batch(("k", n) for n in range(3))}
    dispatch()
    assert {r.headers["pgmb-message-id"] for r in recording_server.requests} == valid


def test_an_address_the_policy_refuses_is_not_the_endpoints_failure(
    dispatch, make_recording_server, make_worker, make_queue, settings
):
    settings.PGMB = {"ENDPOINT_POLICY": {"allow": [], "deny": ["127.0.0.2/32"]}}
    server = make_recording_server()
    worker = make_worker(
        endpoint=f"http://127.0.0.2:{server.port}/hook",
        breaker_failures=1,
        breaker_cooldown=3600,
        breaker_cooldown_max=3600,
    )
    make_queue("#", worker=worker, max_retries=0)
    refused = {str(i) for i in pgmb.send_batch(("k", n) for n in range(3))}

    dispatch()

    dead = dict(DeadLetter.objects.values_list("message", "last_error"))
    assert {str(m) for m in dead} == refused
    assert all(
        e.startswith(OWN_FAILURE + "connection failed: 127.0.0.2 resolves to 127.0.0.2, which ")
        for e in dead.values()
    )
    assert Worker.objects.get(pk=worker.pk).breaker_state == "closed"
    assert server.requests == []
