"""The external dispatcher against real local HTTP servers: what arrives, and what is
recorded for each outcome."""

import asyncio
import base64
import hashlib
import hmac
import json
import time

import pytest

import pgmb
from pgmb import deliveries
from pgmb.db.conninfo import conninfo_from_django
from pgmb.dispatch.engine import Dispatcher, Options
from pgmb.models import Attempt, DeadLetter, Delivery
from tests.httpserver import hangup, reply, retry_after, slow


def test_a_thousand_messages_arrive_exactly_once_and_intact(
    dispatch, recording_server, make_worker, make_queue
):
    worker = make_worker(endpoint=recording_server.url("/hook"), rps=100_000)
    queue = make_queue("order.*", name="orders", worker=worker)
    ids = pgmb.send_batch(
        pgmb.Outgoing(
            "order.created",
            {"n": n, "text": "grüße ✓", "nested": {"list": [1, 2.5, None]}},
            # (A message's own User-Agent is refused at publish: docs/decisions/0030.)
            headers={"tenant": f"t{n % 3}", "trace": {"span": n}},
        )
        for n in range(1000)
    )
    stats = dispatch(concurrency=32, batch=50)
    assert stats.delivered == 1000
    received = recording_server.requests
    assert sorted(r.headers["pgmb-message-id"] for r in received) == sorted(map(str, ids))
    by_id = {r.headers["pgmb-message-id"]: r for r in received}
    for n, mid in enumerate(ids):
        request = by_id[str(mid)]
        assert request.method == "POST"
        assert request.path == "/hook"
        assert request.json() == {"n": n, "text": "grüße ✓", "nested": {"list": [1, 2.5, None]}}
        assert request.headers["content-type"] == "application/json"
        assert request.headers["pgmb-routing-key"] == "order.created"
        assert request.headers["pgmb-queue"] == queue.name
        assert request.headers["pgmb-attempt"] == "1"
        assert request.headers["tenant"] == f"t{n % 3}"
        assert json.loads(request.headers["trace"]) == {"span": n}
        assert request.headers["user-agent"] == "pgmb-dispatcher"
        assert "webhook-signature" not in request.headers
    assert not Delivery.objects.exists()
    assert Attempt.objects.filter(outcome="ack", status_code=200).count() == 1000


def _standard_webhooks_verify(secret_key: bytes, request) -> bool:
    """Verification as a receiver would write it from the Standard Webhooks spec."""
    signed = (
        f"{request.headers['webhook-id']}.{request.headers['webhook-timestamp']}.".encode()
        + request.body
    )
    expected = base64.b64encode(hmac.new(secret_key, signed, hashlib.sha256).digest()).decode()
    return any(
        hmac.compare_digest(part.split(",", 1)[1], expected)
        for part in request.headers["webhook-signature"].split()
        if part.startswith("v1,")
    )


@pytest.mark.parametrize(
    ("secret", "key"),
    [
        ("plain raw secret", b"plain raw secret"),
        ("whsec_" + base64.b64encode(b"0123456789abcdef").decode(), b"0123456789abcdef"),
    ],
)
def test_signature_verifies_independently(
    dispatch, recording_server, make_worker, make_queue, secret, key
):
    worker = make_worker(endpoint=recording_server.url(), secret=secret)
    make_queue("#", worker=worker)
    mid = pgmb.send("a.b", {"x": 1})
    before = time.time()
    dispatch()
    [request] = recording_server.requests
    assert request.headers["webhook-id"] == str(mid)
    # Signed during this dispatch: not before it started, not after the request arrived.
    assert int(before) <= int(request.headers["webhook-timestamp"]) <= request.received_wall
    assert _standard_webhooks_verify(key, request)
    assert not _standard_webhooks_verify(b"wrong", request)


def test_retries_back_off_then_dead_letter(dispatch, recording_server, make_worker, make_queue):
    recording_server.respond(500, "exploded")
    worker = make_worker(endpoint=recording_server.url())
    queue = make_queue("#", worker=worker, max_retries=3, backoff_base=0.2, backoff_max=0.4)
    mid = pgmb.send("k", 1)
    dispatch()
    attempts = recording_server.requests
    assert [r.headers["pgmb-attempt"] for r in attempts] == ["1", "2", "3", "4"]
    failed_at = [
        a.created_at.timestamp()
        for a in Attempt.objects.order_by("attempt").filter(outcome="retry")
    ]
    # Equal jitter: after failure n the retry waits within [d/2, d], d = min(0.4, 0.2 * 2^(n-1)).
    # A retry never arrives before d/2 after the failure was recorded; how much later it comes
    # depends on the machine's load (the window's upper end, on the stored available_at, is
    # tests/sql/test_delivery.py::test_fail_retries_with_backoff_then_dead_letters).
    for failed, retry, d in zip(failed_at, attempts[1:], [0.2, 0.4, 0.4], strict=True):
        assert retry.received_wall >= failed + d / 2 - 0.01, (failed, retry.received_wall, d)
    dead = DeadLetter.objects.get()
    assert (dead.message_id, dead.queue_id, dead.attempts, dead.last_status) == (
        mid,
        queue.pk,
        4,
        500,
    )
    assert "exploded" in dead.last_error
    assert list(Attempt.objects.order_by("attempt").values_list("outcome", flat=True)) == [
        "retry",
        "retry",
        "retry",
        "dead",
    ]


def test_retry_after_is_honoured(dispatch, recording_server, make_worker, make_queue):
    recording_server.script([retry_after(1), reply(200)])
    make_queue("#", worker=make_worker(endpoint=recording_server.url()), backoff_base=0.01)
    pgmb.send("k", 1)
    dispatch()
    first, second = recording_server.requests
    assert first.headers["pgmb-attempt"] == "1"
    # Not retried before the Retry-After second has passed since the 429 was recorded.
    limited = Attempt.objects.get(attempt=1)
    assert (limited.outcome, second.headers["pgmb-attempt"]) == ("retry", "2")
    assert second.received_wall >= limited.created_at.timestamp() + 1.0 - 0.01
    assert list(Attempt.objects.order_by("attempt").values_list("status_code", flat=True)) == [
        429,
        200,
    ]


def test_timeouts_resets_refusals_and_redirects_are_failures(
    dispatch, make_recording_server, make_worker, make_queue
):
    slow_server = make_recording_server()
    slow_server.respond(slow(600))  # the dispatch could only end early by its timeout
    flaky = make_recording_server()
    flaky.respond(hangup())
    moved = make_recording_server()
    moved.respond(reply(302, headers={"Location": "http://127.0.0.1:9/elsewhere"}))
    cases = {
        "slow": make_worker(endpoint=slow_server.url(), timeout=0.3),
        "reset": make_worker(endpoint=flaky.url()),
        "refused": make_worker(endpoint="http://127.0.0.1:9/closed"),
        "moved": make_worker(endpoint=moved.url()),
    }
    for key, worker in cases.items():
        make_queue(key, worker=worker, max_retries=0)
        pgmb.send(key, {"case": key})
    dispatch()
    errors = dict(DeadLetter.objects.values_list("message__routing_key", "last_error"))
    # The slow one was cut at its timeout (the answer would take 10 minutes), not earlier.
    assert errors["slow"] == "timeout after 0.3s"
    assert len(slow_server.requests) == 1
    slow_attempt = Attempt.objects.get(message__routing_key="slow")
    assert slow_attempt.duration_ms >= 300 - 1
    assert "closed by the worker" in errors["reset"]
    assert errors["refused"].startswith("connection failed")
    assert "redirect to http://127.0.0.1:9/elsewhere (not followed)" in errors["moved"]
    assert len(moved.requests) == 1


def test_long_error_bodies_are_truncated(dispatch, recording_server, make_worker, make_queue):
    recording_server.respond(500, "x" * 100_000)
    make_queue("#", worker=make_worker(endpoint=recording_server.url()), max_retries=0)
    pgmb.send("k", 1)
    dispatch(body_limit=300)
    assert len(DeadLetter.objects.get().last_error) <= 320


def test_requeued_dead_letters_are_delivered(
    dispatch, recording_server, make_worker, make_queue, sql
):
    recording_server.script([500, 500])
    queue = make_queue(
        "#", name="jobs", worker=make_worker(endpoint=recording_server.url()), max_retries=0
    )
    pgmb.send_batch([("k", 1), ("k", 2)])
    dispatch()
    assert DeadLetter.objects.filter(queue=queue).count() == 2
    assert deliveries.requeue_queue("jobs") == 2
    dispatch()
    assert not DeadLetter.objects.exists()
    assert sorted(r.json() for r in recording_server.requests[2:]) == [1, 2]
    assert [r.headers["pgmb-attempt"] for r in recording_server.requests[2:]] == ["1", "1"]


def test_paused_queues_and_named_queues(dispatch, recording_server, make_worker, make_queue):
    worker = make_worker(endpoint=recording_server.url())
    make_queue("a", name="qa", worker=worker)
    make_queue("b", name="qb", worker=worker)
    make_queue("c", name="qc", worker=worker, paused=True)
    pgmb.send_batch([("a", "a"), ("b", "b"), ("c", "c")])
    dispatch(queues=["qb"])
    assert [r.json() for r in recording_server.requests] == ["b"]
    dispatch()
    assert sorted(r.json() for r in recording_server.requests) == ["a", "b"]
    assert Delivery.objects.get().queue.name == "qc"


def test_retries_log_at_info_and_dead_letters_as_a_warning(
    dispatch, recording_server, make_worker, make_queue, caplog
):
    recording_server.respond(500)
    make_queue(
        "#",
        worker=make_worker(endpoint=recording_server.url()),
        max_retries=1,
        backoff_base=0,
        backoff_max=0,
    )
    pgmb.send("k", 1)
    with caplog.at_level("INFO", logger="pgmb.dispatch"):
        dispatch()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "attempt=" in r.getMessage()]
    assert [level for level, _ in lines] == ["INFO", "WARNING"]
    assert lines[0][1].startswith("failed, will retry queue=") and "attempt=1/2" in lines[0][1]
    assert lines[1][1].startswith("dead-lettered queue=") and "attempt=2/2" in lines[1][1]
    assert DeadLetter.objects.count() == 1


def test_an_outcome_the_database_refuses_does_not_hold_back_the_others(
    transactional_db, make_queue, caplog
):
    make_queue("#")
    pgmb.send_batch([("k", 1), ("k", 2)])
    claims = deliveries.claim(None, 10)
    good = [deliveries.Failure(c.delivery_id, c.lease_id, 500, "down") for c in claims]
    refused = deliveries.Failure(2**70, claims[0].lease_id, 500, "no such id")  # not a bigint

    async def write() -> None:
        dispatcher = Dispatcher(conninfo_from_django("default"), Options())
        try:
            await dispatcher.outcomes.write(deliveries.fail_call, [good[0], refused, good[1]])
        finally:
            await dispatcher.outcomes.db.close()

    with caplog.at_level("ERROR", logger="pgmb.dispatch"):
        asyncio.run(write())
    assert Attempt.objects.filter(outcome="retry").count() == 2
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("could not record an outcome (")
    assert "lease will expire" in line and "no such id" in line  # names the one refused


def test_errors_are_stored_whatever_characters_they_hold(make_queue):
    make_queue("#")
    pgmb.send("k", 1)
    [claim] = deliveries.claim()
    error = "HTTP 500: a\x00b \ud800 c"
    assert deliveries.fail([deliveries.Failure(claim.delivery_id, claim.lease_id, 500, error)])
    assert Delivery.objects.get().last_error == "HTTP 500: a\\x00b \\ud800 c"
