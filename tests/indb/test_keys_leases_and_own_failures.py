"""The in-database loop, with each transport, against real endpoints on loopback: a
producer's Unicode routing key reaches the worker percent-encoded as pgmb_dispatch sends it;
a request pgmb cannot build or may not send is the delivery's failure, never the endpoint's;
no request is posted that could outlast its lease, with two loops sharing the work; and the
PL/Python transport's name resolution ends by the request's deadline and its URL
credentials go as Basic, as pgmb_dispatch's do."""

from __future__ import annotations

import base64
import uuid
from collections import Counter
from urllib.parse import unquote

import pytest

import pgmb
from pgmb.dispatch import http1
from pgmb.dispatch.client import OWN_FAILURE
from pgmb.models import Attempt, DeadLetter, Delivery, Worker
from pgmb.worker_request import signature
from tests.stored_rows import store_with_triggers_off
from tests.waiting import wait_until

plpython_only = pytest.mark.parametrize("transport", ["plpython3u"], indirect=True)

#: Keys of a producer's messages, and the header each reaches the worker with.
KEYS = {
    "c.zoé": b"c.zo%C3%A9",
    "c.€": b"c.%E2%82%AC",
    "c.注文": b"c.%E6%B3%A8%E6%96%87",
    "c.100%": b"c.100%25",
    "c.ok": b"c.ok",
}


def test_a_producers_unicode_routing_keys_reach_the_worker_and_never_open_its_breaker(
    transport, dispatch_until, recording_server, make_worker, make_queue, login_role
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
        producer.execute("SELECT pgmb.send(%s, %s, %s::jsonb)", (message_id, key, str(n)))
        sent[str(message_id)] = key

    dispatch_until(
        lambda: (
            not Delivery.objects.exists()
            or Worker.objects.get(pk=worker.pk).breaker_state != "closed"
        ),
        "every message delivered (or the breaker open)",
    )

    assert Worker.objects.get(pk=worker.pk).breaker_state == "closed"
    assert Attempt.objects.filter(outcome="ack").count() == len(sent)
    received = {}
    for record in recording_server.requests:
        # aiohttp hands a header's bytes over as UTF-8 with surrogateescape: these are them.
        raw = record.headers["pgmb-routing-key"].encode("utf-8", "surrogateescape")
        received[record.headers["pgmb-message-id"]] = raw
    assert received == {m: KEYS[key] for m, key in sent.items()}
    assert {m: unquote(raw.decode("ascii")) for m, raw in received.items()} == sent


def test_a_request_pgmb_cannot_build_is_the_deliverys_failure_not_the_endpoints(
    transport, dispatch_until, recording_server, make_worker, make_queue
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

    dispatch_until(lambda: DeadLetter.objects.count() == 3, "3 dead letters")

    assert recording_server.requests == []
    assert {str(m) for m in DeadLetter.objects.values_list("message", flat=True)} == unbuildable
    errors = list(Attempt.objects.values_list("status_code", "error"))
    assert len(errors) == 6  # two attempts each: retried, then dead-lettered
    assert all(
        status is None and error.startswith(OWN_FAILURE + "could not build the request: ")
        for status, error in errors
    )
    w = Worker.objects.get(pk=worker.pk)
    assert (w.breaker_state, w.breaker_streak, w.breaker_requests) == ("closed", 0, 0)

    # The worker's next messages go out: nothing held them back.
    Worker.objects.filter(pk=worker.pk).update(secret="")
    valid = {str(i) for i in pgmb.send_batch(("k", n) for n in range(3))}
    dispatch_until(lambda: not Delivery.objects.exists(), "the valid messages delivered")
    assert {r.headers["pgmb-message-id"] for r in recording_server.requests} == valid


@plpython_only
def test_an_address_the_policy_refuses_is_not_the_endpoints_failure(
    transport, pg, dispatch_until, make_recording_server, make_worker, make_queue
):
    pg.execute("UPDATE pgmb.endpoint_policy SET allow = '{}', deny = '{127.0.0.2/32}'")
    server = make_recording_server()
    worker = make_worker(
        endpoint=f"http://127.0.0.2:{server.port}/hook",
        breaker_failures=1,
        breaker_cooldown=3600,
        breaker_cooldown_max=3600,
    )
    make_queue("#", worker=worker, max_retries=0)
    refused = {str(i) for i in pgmb.send_batch(("k", n) for n in range(3))}
    try:
        dispatch_until(lambda: DeadLetter.objects.count() == 3, "3 dead letters")
    finally:
        pg.execute("UPDATE pgmb.endpoint_policy SET allow = DEFAULT, deny = DEFAULT")

    dead = dict(DeadLetter.objects.values_list("message", "last_error"))
    assert {str(m) for m in dead} == refused
    assert all(
        e.startswith(OWN_FAILURE + "connection failed: 127.0.0.2 resolves to 127.0.0.2, which ")
        for e in dead.values()
    )
    assert Worker.objects.get(pk=worker.pk).breaker_state == "closed"
    assert server.requests == []


def test_two_loops_post_nothing_that_could_outlast_its_lease(
    transport, pg, start_loop, recording_server, make_worker, make_queue
):
    """Issue 26, item 2: worker timeout 1 s, lease 2 s, an endpoint answering in 0.9 s,
    6 messages claimed by one loop; a second loop starts once the fourth request came (past
    the first claim's leases, had the first loop posted on)."""
    recording_server.respond(204, delay=0.9)
    worker = make_worker(endpoint=recording_server.url("/slow"), timeout=1)
    make_queue("#", worker=worker, lease_seconds=2, backoff_base=0, backoff_max=0)
    ids = {str(i) for i in pgmb.send_batch(("k", n) for n in range(6))}

    first = start_loop(seconds=120)
    recording_server.wait_for(4)
    second = start_loop(seconds=120)
    wait_until(
        lambda: (
            Attempt.objects.filter(outcome="ack").count() == 6 and not recording_server.in_flight
        ),
        message="6 acknowledgements",
    )
    first.stop(pg)
    second.stop(pg)

    posts = Counter(r.headers["pgmb-message-id"] for r in recording_server.requests)
    assert set(posts) == ids
    outcomes = Counter(Attempt.objects.values_list("outcome", flat=True))
    assert outcomes["expired"] == 0, outcomes
    # A message is posted once per attempt recorded for it: one that failed (an answer
    # slower than the timeout on a loaded machine) is retried, and no request is left
    # unaccounted for.
    recorded = Counter(
        str(m)
        for m in Attempt.objects.filter(outcome__in=["ack", "retry", "dead"]).values_list(
            "message", flat=True
        )
    )
    assert posts == recorded


@pytest.fixture
def slow_name_in_the_backend(pg):
    """In this backend, resolving slow.pgmb.test takes 20 s, then answers 127.0.0.1 (and
    GD["pgmb_test_resolved"] says it has)."""
    pg.execute("""DO $$
import socket, time
real = socket.getaddrinfo
def getaddrinfo(host, port, *args, **kwargs):
    if host == "slow.pgmb.test":
        time.sleep(20)
        GD["pgmb_test_resolved"] = True
        host = "127.0.0.1"
    return real(host, port, *args, **kwargs)
GD["pgmb_test_real_getaddrinfo"] = real
socket.getaddrinfo = getaddrinfo
$$ LANGUAGE plpython3u""")
    yield
    pg.execute("""DO $$
import socket
socket.getaddrinfo = GD.pop("pgmb_test_real_getaddrinfo")
$$ LANGUAGE plpython3u""")


def _post(pg, url: str, timeout: float) -> tuple:
    return pg.execute(
        "SELECT (o).status, (o).error FROM (SELECT pgmb.post_via_plpython(%s, '{}', '{}', %s)"
        " AS o) AS s",
        (url, timeout),
    ).fetchone()


@plpython_only
def test_plpython_name_resolution_ends_by_the_deadline(
    transport, pg, recording_server, slow_name_in_the_backend
):
    status, error = _post(pg, f"http://slow.pgmb.test:{recording_server.port}/hook", 0.5)
    pg.execute("""DO $$
resolved = bool(GD.get("pgmb_test_resolved"))
plpy.execute("SELECT set_config('pgmb_test.resolved', '%s', false)" % resolved)
$$ LANGUAGE plpython3u""")

    # The request ended while the name was still being resolved, not after.
    assert pg.execute("SELECT current_setting('pgmb_test.resolved')").fetchone()[0] == "False"
    assert (status, error) == (None, "timeout after 0.5s")
    assert recording_server.requests == []
    # The transport goes on: the next request resolves and is answered.
    assert _post(pg, recording_server.url("/next"), 5)[0] == 200


@plpython_only
def test_plpython_sends_the_urls_credentials_as_pgmb_dispatch_does(transport, pg, recording_server):
    url = recording_server.url("/hook").replace("http://", "http://al%C3%AFce:p%40ss:w@")

    assert _post(pg, url, 5)[0] == 200

    [record] = recording_server.requests
    sent = record.headers["Authorization"]
    assert sent == "Basic " + base64.b64encode("alïce:p@ss:w".encode()).decode()
    assert f"Authorization: {sent}\r\n" in http1.parse_endpoint(url).head


def test_a_claim_with_a_request_pgmb_cannot_build_signs_the_rest_each_for_itself(
    transport, dispatch_until, make_recording_server, make_worker, make_queue
):
    # The claim's headers are built in one statement; when one row's cannot be, each row
    # builds its own: the unbuildable row fails alone, the others go out signed.
    bad_server, good_server = make_recording_server(), make_recording_server()
    bad = make_worker(endpoint=bad_server.url("/hook"))
    secret = "whsec_" + base64.b64encode(b"a claim's signing secret 89").decode()
    good = make_worker(endpoint=good_server.url("/hook"), secret=secret)
    make_queue("bad.#", worker=bad, max_retries=0)
    make_queue("good.#", worker=good)
    store_with_triggers_off("UPDATE pgmb_worker SET secret = 'whsec_a' WHERE id = %s", (bad.pk,))
    sent = [pgmb.send(f"{kind}.k", {"n": n}) for n in range(3) for kind in ("bad", "good")]
    signed = {str(m) for m in sent[1::2]}

    dispatch_until(lambda: not Delivery.objects.exists(), "every delivery done")

    assert bad_server.requests == []
    assert {str(m) for m in DeadLetter.objects.values_list("message", flat=True)} == {
        str(m) for m in sent[::2]
    }
    assert {r.headers["pgmb-message-id"] for r in good_server.requests} == signed
    for r in good_server.requests:
        expected = signature(
            secret, r.headers["webhook-id"], int(r.headers["webhook-timestamp"]), r.body
        )
        assert r.headers["webhook-signature"] == expected
