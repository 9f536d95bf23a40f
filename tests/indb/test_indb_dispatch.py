"""The in-database dispatcher, with real HTTP, through both transports."""

import base64
import hashlib
import hmac
import time

import pytest

import pgmb
from pgmb.models import Attempt, DeadLetter, Delivery, Message, Worker
from pgmb.worker_request import build_headers
from tests.httpserver import hangup, reply, retry_after, slow
from tests.stored_rows import triggers_off


@pytest.mark.parametrize(
    "key",
    [b"", b"k", b"0123456789abcdef", b"x" * 64, b"y" * 65, bytes(range(200))],
)
def test_sql_hmac_matches_python(pg, key):
    data = b'msg_1.1700000000.{"a": 1}'
    [(digest,)] = pg.execute("SELECT pgmb.hmac_sha256(%s, %s)", (key, data)).fetchall()
    assert digest == hmac.new(key, data, hashlib.sha256).digest()


WHSEC = "whsec_" + base64.b64encode(b"k" * 24).decode()


@pytest.mark.parametrize(
    "secrets",
    # The worker's secrets in turn: the last is current; the others retire (rotation).
    [
        [""],
        ["plain raw secret"],
        [WHSEC],
        [WHSEC, "plain raw secret"],
        ["plain raw secret", "", WHSEC],
    ],
)
def test_sql_headers_match_the_python_dispatcher(pg, make_worker, make_queue, secrets):
    worker = make_worker(secret=secrets[0])
    for secret in secrets[1:]:
        Worker.objects.filter(pk=worker.pk).update(secret=secret)
    signing = [s for s in [secrets[-1], *reversed(secrets[:-1])] if s]
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
        "User-Agent": "theirs",
        "user-agent": "theirs too",
    }
    mid = pgmb.send("k.l", {"x": "é"}, headers={"tenant": "eu"})
    # Publish refuses reserved names (docs/decisions/0030); rows stored before still drop them.
    with triggers_off():
        Message.objects.filter(pk=mid).update(headers=headers)
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
        secrets=signing,
        timestamp=1700000000,
    )
    assert sql_headers == python_headers
    assert len(sql_headers.get("webhook-signature", "").split()) == len(signing)
    assert sql_headers["tenant"] == "eu"
    assert "crlf" not in sql_headers and "unicode" not in sql_headers
    # The transports send their own User-Agent, never a message's (0032).
    assert not {"User-Agent", "user-agent"} & set(sql_headers)
    assert sql_headers["pgmb-queue"] == "hq"


def test_dispatch_loop_delivers(
    transport, dispatch_until, recording_server, make_worker, make_queue
):
    secret = "whsec_" + base64.b64encode(b"s" * 32).decode()
    worker = make_worker(endpoint=recording_server.url("/in-db"), secret=secret)
    queue = make_queue("order.*", worker=worker)
    ids = pgmb.send_batch(
        pgmb.Outgoing("order.created", {"n": n, "t": "ü"}, headers={"tenant": "eu"})
        for n in range(20)
    )
    dispatch_until(lambda: not Delivery.objects.exists(), "all 20 messages to be delivered")
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
    transport, dispatch_until, make_recording_server, make_worker, make_queue
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
    dispatch_until(lambda: Attempt.objects.count() == 5, "an outcome for each of the 5 cases")
    dead = dict(DeadLetter.objects.values_list("message__routing_key", "last_error"))
    assert set(dead) == {"fail", "slow", "reset", "refused"}
    assert dead["fail"] == "HTTP 500: broken"
    # Cut at its 0.3 s timeout: waiting for the 3 s answer would have acked it.
    assert dead["slow"].startswith(("timeout", "HTTP request failed"))
    assert dead["refused"] and dead["reset"]
    waiting = Delivery.objects.get(message__routing_key="limit")
    assert (waiting.state, waiting.attempts, waiting.last_status) == ("ready", 1, 429)
    # Due again 120 s (the Retry-After) after the failure was recorded.
    failed = Attempt.objects.get(message__routing_key="limit")
    assert failed.outcome == "retry"
    assert 119 <= (waiting.available_at - failed.created_at).total_seconds() <= 121


def test_rate_limit_in_database(
    transport, dispatch_until, recording_server, make_worker, make_queue
):
    rps, burst = 20, 0.2  # dispatch_loop's default burst: the bucket holds rps * burst tokens
    worker = make_worker(endpoint=recording_server.url(), rps=rps)
    make_queue("#", worker=worker)
    pgmb.send_batch(("k", n) for n in range(200))
    # The worker's bucket starts full when first claimed from and refills at rps: by any
    # moment t at most rps * burst + rps * (t - opened) requests can have been claimed,
    # hence sent. A loaded machine only sends them later.
    opened = time.monotonic()
    dispatch_until(lambda: len(recording_server.requests) >= 40, "40 requests", seconds=2.0)
    arrived = [r.received_at for r in recording_server.requests]
    assert arrived == sorted(arrived)  # one request at a time
    for count, at in enumerate(arrived, start=1):
        allowed = rps * burst + rps * (at - opened) + 1  # one token for clock rounding
        assert count <= allowed, f"request {count} arrived {at - opened:.2f} s after opening"
    worker.refresh_from_db()
    assert 0 <= worker.tokens <= rps * burst
    assert len({r.headers["pgmb-message-id"] for r in recording_server.requests}) == len(arrived)


def test_dispatch_loop_stops_on_time_and_hands_back(
    transport, dispatch_loop, recording_server, make_worker, make_queue
):
    recording_server.respond(reply(200, delay=0.3))
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    pgmb.send_batch(("k", n) for n in range(20))
    dispatch_loop(2.0, batch=20)  # one claim takes all 20
    posted = len(recording_server.requests)
    # Each post takes at least the 0.3 s the server waits, and none starts after the 2 s
    # are up: at most 7 of them, however busy the machine.
    assert 1 <= posted <= 7
    assert Delivery.objects.count() == 20 - posted
    assert not Delivery.objects.filter(state="leased").exists()
    assert set(Delivery.objects.values_list("attempts", flat=True)) == {0}


def test_the_loop_delivers_over_kept_connections(
    transport, dispatch_until, recording_server, make_worker, make_queue
):
    make_queue("#", worker=make_worker(endpoint=recording_server.url("/loop")))
    pgmb.send_batch(("k", n) for n in range(30))
    dispatch_until(lambda: not Delivery.objects.exists(), "all 30 messages to be delivered")
    received = recording_server.requests
    assert sorted(r.json() for r in received) == list(range(30))
    assert Attempt.objects.filter(outcome="ack").count() == 30
    if transport == "plpython3u":
        # One connection a request in a window (8 at most), kept for the next windows.
        assert len({r.peer for r in received}) <= 8
    else:  # the loop turns http.keepalive on in its session: one connection, kept
        assert {r.headers["Connection"].lower() for r in received} == {"keep-alive"}
        assert len({r.peer for r in received}) == 1


def test_an_answer_the_loop_does_not_follow_is_its_outcome(
    transport, dispatch_until, recording_server, make_worker, make_queue
):
    # 304 is followed by no transport (pgsql-http follows the other redirects itself): its
    # Location is read from the answer's headers into the outcome.
    recording_server.respond(reply(304, headers={"Location": "http://elsewhere/"}))
    make_queue("k", worker=make_worker(endpoint=recording_server.url()), max_retries=0)
    pgmb.send("k", {})
    dispatch_until(lambda: DeadLetter.objects.exists(), "the dead letter")
    dead = DeadLetter.objects.get()
    assert dead.last_status == 304
    assert dead.last_error.startswith("HTTP 304 redirect to http://elsewhere/ (not followed)")
