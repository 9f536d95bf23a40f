"""The in-database loop forwards a traced message's stored context as it is (pgmb.tracing):
the worker's span is then the publisher's child (no span of the attempt: PostgreSQL has no
OpenTelemetry)."""

from __future__ import annotations

from opentelemetry import trace

import pgmb
from tests.spans import traceparent


def test_the_worker_gets_the_publishers_context(
    spans, transport, dispatch_until, make_recording_server, make_worker, make_queue
):
    server = make_recording_server()
    make_queue("#", worker=make_worker(endpoint=server.url()))
    with trace.get_tracer("test").start_as_current_span("publish") as publisher:
        pgmb.send("k", {"n": 1})
    dispatch_until(lambda: len(server.requests) == 1, "the request")
    assert server.requests[0].headers["traceparent"] == traceparent(publisher)
