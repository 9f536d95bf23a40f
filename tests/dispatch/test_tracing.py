"""The trace of a message through the external dispatcher (pgmb.tracing): the publisher's
context stored in the message, a span per attempt as its child, and the worker handed the
attempt's span as its parent. Untraced messages get no span and no header."""

from __future__ import annotations

import json

from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

import pgmb
from pgmb.models import Message
from tests.httpserver import reply
from tests.spans import named, traceparent


def test_each_attempt_is_a_span_under_the_publishers_and_the_worker_under_it(
    spans, dispatch, make_recording_server, make_worker, make_queue
):
    server = make_recording_server()
    server.script([reply(500, "not yet"), reply(200)])
    make_queue(
        "orders.#",
        name="orders",
        worker=make_worker(endpoint=server.url()),
        max_retries=2,
        backoff_base=0.01,
        backoff_max=0.02,
    )
    with trace.get_tracer("a web request").start_as_current_span("POST /orders") as publisher:
        message_id = pgmb.send("orders.created", {"id": 7})
    stored = Message.objects.get(pk=message_id).headers
    assert stored["traceparent"] == traceparent(publisher)

    dispatch()

    first, second = sorted(named(spans, "deliver orders"), key=lambda s: s.start_time)
    publisher_context = publisher.get_span_context()
    for n, span in enumerate((first, second), start=1):
        assert span.kind == SpanKind.CLIENT
        assert span.parent.span_id == publisher_context.span_id
        assert span.context.trace_id == publisher_context.trace_id
        assert span.attributes["pgmb.attempt"] == n
        assert span.attributes["messaging.message.id"] == str(message_id)
        assert span.attributes["messaging.destination.name"] == "orders"
        assert span.attributes["pgmb.duration_ms"] >= 0
    assert first.attributes["http.response.status_code"] == 500
    assert first.status.status_code == StatusCode.ERROR
    assert "not yet" in first.status.description
    assert second.attributes["http.response.status_code"] == 200
    assert second.status.status_code == StatusCode.UNSET
    # The worker's parent is the attempt that carried the request, not the publisher.
    requests = server.requests
    assert [r.headers["traceparent"] for r in requests] == [traceparent(first), traceparent(second)]


def test_a_header_the_publisher_sets_is_kept(spans, db):
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with trace.get_tracer("test").start_as_current_span("publish"):
        message_id = pgmb.send("k", {}, headers={"traceparent": given})
    assert Message.objects.get(pk=message_id).headers["traceparent"] == given


def test_untraced_messages_get_no_span_and_no_header(
    spans, dispatch, make_recording_server, make_worker, make_queue
):
    server = make_recording_server()
    make_queue("#", worker=make_worker(endpoint=server.url()))
    [message_id] = pgmb.send_batch([("k", {"n": 1})])
    assert Message.objects.get(pk=message_id).headers == {}
    dispatch()
    [request] = server.requests
    assert "traceparent" not in request.headers
    assert spans.get_finished_spans() == ()


def test_a_batch_carries_its_publishers_context(spans, db):
    with trace.get_tracer("test").start_as_current_span("import") as publisher:
        ids = pgmb.send_batch(
            [("k", {"n": 1}), {"routing_key": "k", "body": 2, "headers": {"a": "b"}}]
        )
    headers = [Message.objects.get(pk=i).headers for i in ids]
    assert [h["traceparent"] for h in headers] == [traceparent(publisher)] * 2
    assert headers[1]["a"] == "b"
    assert json.dumps(headers[0]).count("traceparent") == 1
