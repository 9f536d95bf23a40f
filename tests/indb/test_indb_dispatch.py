"""The in-database dispatcher, with real HTTP, through both transports."""

import base64
import hashlib
import hmac
import time

import pytest

import pgmb
from pgmb.dispatch.request import build_headers
from pgmb.models import Attempt, DeadLetter, Delivery
from tests.httpserver import hangup, reply, retry_after, slow


@pytest.mark.parametrize(
    "key",
    [b"", b"k", b"0123456789abcdef", b"x" * 64, b"y" * 65, bytes(range(200))],
)
def test_sql_hmac_matches_python(pg, key):
    data = b'msg_1.1700000000.{"a": 1}'
    [(digest,)] = pg.execute("SELECT pgmb.hmac_sha256(%s, %s)", (key, data)).fetchall()
    assert digest == hmac.new(key, data, hashlib.sha256).digest()


@pytest.mark.parametrize("secret", ["", "plain", "whsec_" + base64.b64encode(b"k" * 24).decode()])
def test_sql_headers_match_the_python_dispatcher(pg, make_worker, make_queue, secret):
    worker = make_worker(secret=secret)
    make_queue("#", name="hq", worker=worker)
    headers = {
        "tenant": "eu",
        "count": 3,
        "nested": {"a": [1, None]},
        "Content-Type": "text/evil",
        "pgmb-queue": "spoofed",
        "bad name": "x",
        "crlf": "a\r\nInjected: 1",
        "unicode": "grüße",
    }
    pgmb.send("k.l", {"x": "é"}, headers=headers)
    [(message_id, attempt, sql_headers)] = pg.execute(
        "SELECT c.message_id, c.attempt, pgmb.request_headers(c, 1700000000)"
        " FROM pgmb.claim(NULL, 1) AS c"
    ).fetchall()
    [(body,)] = pg.execute(
        "SELECT body::text FROM pgmb_message WHERE id = %s", (message_id,)
    ).fetchall()
    python_headers = build_headers(
        message_id=str(message_id),
        routing_key="k.l",
        queue="hq",
        attempt=attempt,
        headers=headers,
        body=body.encode(),
        secret=secret,
        timestamp=1700000000,
    )
    assert sql_headers == python_headers
    assert sql_headers["tenant"] == "eu"
    assert "crlf" not in sql_headers and "unicode" not in sql_headers
    assert sql_headers["pgmb-queue"] == "hq"


def test_dispatch_loop_delivers(
    transport, dispatch_loop, recording_server, make_worker, make_queue
):
    secret = "whsec_" + base64.b64encode(b"s" * 32).decode()
    worker = make_worker(endpoint=recording_server.url("/in-db"), secret=secret)
    queue = make_queue("order.*", worker=worker)
    ids = pgmb.send_batch(
        pgmb.Outgoing("order.created", {"n": n, "t": "ü"}, headers={"tenant": "eu"})
        for n in range(20)
    )
    dispatch_loop(1.0)
    received = recording_server.requests
    assert sorted(r.headers["pgmb-message-id"] for r in received) == sorted(map(str, ids))
    for request in received:
        assert request.path == "/in-db"
        assert request.headers["content-type"].startswith("application/json")
        assert request.headers["pgmb-queue"] == queue.name
        assert request.headers["tenant"] == "eu"
        assert request.json()["t"] == "ü"
        signed = (
            f"{request.headers['webhook-id']}.{request.headers['webhook-timestamp']}.".encode()
            + request.body
        )
        expected = base64.b64encode(hmac.new(b"s" * 32, signed, hashlib.sha256).digest()).decode()
        assert request.headers["webhook-signature"] == f"v1,{expected}"
    assert not Delivery.objects.exists()
    assert Attempt.objects.filter(outcome="ack").count() == 20


def test_failures_retry_and_dead_letter(
    transport, dispatch_loop, make_recording_server, make_worker, make_queue
):
    failing = make_recording_server()
    failing.respond(500, "broken")
    limited = make_recording_server()
    limited.respond(retry_after(120))
    slow_server = make_recording_server()
    slow_server.respond(slow(3))
    resetting = make_recording_server()
    resetting.respond(hangup())
    cases = {
        "fail": make_worker(endpoint=failing.url()),
        "limit": make_worker(endpoint=limited.url()),
        "slow": make_worker(endpoint=slow_server.url(), timeout=0.3),
        "reset": make_worker(endpoint=resetting.url()),
        "refused": make_worker(endpoint="http://127.0.0.1:9/"),
    }
    for key, worker in cases.items():
        make_queue(key, worker=worker, max_retries=0 if key != "limit" else 3)
        pgmb.send(key, {"case": key})
    started = time.monotonic()
    dispatch_loop(1.0)
    assert time.monotonic() - started < 3
    dead = dict(DeadLetter.objects.values_list("message__routing_key", "last_error"))
    assert dead["fail"] == "HTTP 500: broken"
    assert dead["slow"].startswith(("timeout", "HTTP request failed"))
    assert dead["refused"] and dead["reset"]
    waiting = Delivery.objects.get(message__routing_key="limit")
    assert waiting.last_status == 429
    assert 100 < (waiting.available_at - waiting.created_at).total_seconds() < 130


def test_rate_limit_in_database(
    transport, dispatch_loop, recording_server, make_worker, make_queue
):
    make_queue("#", worker=make_worker(endpoint=recording_server.url(), rps=20))
    pgmb.send_batch(("k", n) for n in range(200))
    dispatch_loop(2.0)
    count = len(recording_server.requests)
    assert 30 <= count <= 50  # 20/s for 2 s, plus at most one bucket (rps * 0.2)
    times = [r.received_at for r in recording_server.requests]
    assert times[-1] - times[0] >= 1.4


def test_dispatch_loop_stops_on_time_and_hands_back(
    transport, dispatch_loop, recording_server, make_worker, make_queue
):
    recording_server.respond(reply(200, delay=0.3))
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    pgmb.send_batch(("k", n) for n in range(20))
    started = time.monotonic()
    dispatch_loop(1.0, batch=20)
    assert time.monotonic() - started < 2.0
    posted = len(recording_server.requests)
    assert 2 <= posted < 20
    assert Delivery.objects.count() == 20 - posted
    assert not Delivery.objects.filter(state="leased").exists()
    assert set(Delivery.objects.values_list("attempts", flat=True)) == {0}
