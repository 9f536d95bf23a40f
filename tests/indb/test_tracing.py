"""The in-database loop forwards a traced message's stored context as it is (pgmb.tracing):
the worker's span is then the publisher's child. Its attempts become spans afterwards, made
from the history by pgmb_trace_export (pgmb.trace_export): one CLIENT span per attempt, a
child of the publisher's, each attempt exported once."""

from __future__ import annotations

import asyncio
import threading
from io import StringIO

import psycopg
from django.core.management import call_command
from django.db import connections
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

import pgmb
from pgmb import trace_export
from pgmb.db.conninfo import conninfo_from_django
from pgmb.dispatch.engine import Dispatcher, Options
from pgmb.models import Attempt
from tests.httpserver import reply
from tests.spans import named, traceparent
from tests.waiting import wait_until


def test_the_worker_gets_the_publishers_context(
    spans, transport, dispatch_until, make_recording_server, make_worker, make_queue
):
    server = make_recording_server()
    make_queue("#", worker=make_worker(endpoint=server.url()))
    with trace.get_tracer("test").start_as_current_span("publish") as publisher:
        pgmb.send("k", {"n": 1})
    dispatch_until(lambda: len(server.requests) == 1, "the request")
    assert server.requests[0].headers["traceparent"] == traceparent(publisher)


def test_each_attempt_of_the_loop_is_exported_once_as_a_span_under_the_publishers(
    spans, transport, dispatch_until, make_recording_server, make_worker, make_queue
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
    dispatch_until(
        lambda: Attempt.objects.filter(message_id=message_id).count() == 2, "two attempts"
    )
    assert named(spans, "deliver orders") == []  # the loop made none

    out = call_command_output("--lag", "0")
    assert out == "2 spans made of 2 attempts of the in-database loop"

    first, second = sorted(named(spans, "deliver orders"), key=lambda s: s.start_time)
    publisher_context = publisher.get_span_context()
    history = {a.attempt: a for a in Attempt.objects.filter(message_id=message_id)}
    for n, span in enumerate((first, second), start=1):
        assert span.kind == SpanKind.CLIENT
        assert span.parent.span_id == publisher_context.span_id
        assert span.context.trace_id == publisher_context.trace_id
        assert span.attributes["pgmb.attempt"] == n
        assert span.attributes["messaging.system"] == "pgmb"
        assert span.attributes["messaging.message.id"] == str(message_id)
        assert span.attributes["messaging.destination.name"] == "orders"
        # The attempt's own times: it ends when its outcome was recorded and lasts the
        # request's duration.
        recorded = history[n].created_at.timestamp()
        assert abs(span.end_time / 1e9 - recorded) < 1e-3
        assert span.attributes["pgmb.duration_ms"] == history[n].duration_ms
        assert abs((span.end_time - span.start_time) / 1e6 - history[n].duration_ms) < 1e-3
    assert first.attributes["http.response.status_code"] == 500
    assert first.status.status_code == StatusCode.ERROR
    assert "not yet" in first.status.description
    assert second.attributes["http.response.status_code"] == 200
    assert second.status.status_code == StatusCode.UNSET
    # The worker got the publisher's context both times: its spans are the attempts' siblings.
    assert [r.headers["traceparent"] for r in server.requests] == [traceparent(publisher)] * 2

    # Run again, and once more after more traffic: nothing is exported twice.
    spans.clear()
    assert call_command_output("--lag", "0") == "0 spans made of 0 attempts of the in-database loop"
    server.script([reply(200)])
    with trace.get_tracer("test").start_as_current_span("again"):
        again = pgmb.send("orders.created", {"id": 8})
    dispatch_until(lambda: Attempt.objects.filter(message_id=again).exists(), "the attempt")
    assert call_command_output("--lag", "0") == "1 spans made of 1 attempts of the in-database loop"
    [span] = named(spans, "deliver orders")
    assert span.attributes["messaging.message.id"] == str(again)


def test_only_the_loops_attempts_of_traced_messages_are_exported(
    spans, pg, transport, dispatch_until, make_recording_server, make_worker, make_queue
):
    server = make_recording_server()
    make_queue("#", name="q", worker=make_worker(endpoint=server.url()))
    with trace.get_tracer("test").start_as_current_span("publish"):
        by_dispatcher = pgmb.send("k", {"n": 1})
    asyncio.run(
        Dispatcher(conninfo_from_django("default"), Options(until_idle=True, max_seconds=120)).run()
    )
    untraced = pgmb.send("k", {"n": 2})
    with trace.get_tracer("test").start_as_current_span("publish"):
        by_loop = pgmb.send("k", {"n": 3})
    dispatch_until(lambda: len(server.requests) == 3, "the requests")
    marked = dict(pg.execute("SELECT message_id, indb FROM pgmb_attempt").fetchall())
    assert marked == {by_dispatcher: False, untraced: True, by_loop: True}
    spans.clear()  # pgmb_dispatch's own span of its attempt

    done = trace_export.export(lag=0)

    assert done == trace_export.Exported(read=2, spans=1)  # the loop's two; one traced
    [span] = spans.get_finished_spans()
    assert span.attributes["messaging.message.id"] == str(by_loop)


def test_an_attempt_is_left_for_later_until_its_lag_has_passed(
    spans, transport, dispatch_until, make_recording_server, make_worker, make_queue
):
    server = make_recording_server()
    make_queue("#", worker=make_worker(endpoint=server.url()))
    with trace.get_tracer("test").start_as_current_span("publish"):
        pgmb.send("k", {"n": 1})
    dispatch_until(lambda: len(server.requests) == 1, "the request")
    assert trace_export.export(lag=3600) == trace_export.Exported(read=0, spans=0)
    assert trace_export.export(lag=0) == trace_export.Exported(read=1, spans=1)


def test_an_exporter_that_waited_for_another_goes_on_where_that_one_stopped(
    spans, pg, transport, dispatch_until, make_recording_server, make_worker, make_queue
):
    server = make_recording_server()
    make_queue("#", worker=make_worker(endpoint=server.url()))
    with trace.get_tracer("test").start_as_current_span("publish"):
        pgmb.send("k", {"n": 1})
    dispatch_until(lambda: len(server.requests) == 1, "the request")
    trace_export.export(lag=3600)  # makes the position row, reads nothing yet
    other = psycopg.connect(**conninfo_from_django("default"))
    try:
        # Another exporter holds the position while it exports the attempt.
        other.execute("SELECT * FROM pgmb.trace_export FOR UPDATE")
        done: list[trace_export.Exported] = []
        waiting = threading.Thread(target=lambda: done.append(export_and_close()))
        waiting.start()
        wait_until(
            lambda: pg.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%%pgmb.trace_export FOR UPDATE%%'"
            ).fetchall(),
            message="the second exporter waiting for the position",
        )
        other.execute(
            "UPDATE pgmb.trace_export SET (recorded_at, attempt_id) ="
            " (SELECT created_at, id FROM pgmb_attempt ORDER BY created_at DESC, id DESC LIMIT 1)"
        )
        other.commit()
        waiting.join(timeout=60)
    finally:
        other.close()
    assert done == [trace_export.Exported(read=0, spans=0)]
    assert [s.name for s in spans.get_finished_spans()] == ["publish"]


def export_and_close() -> trace_export.Exported:
    try:
        return trace_export.export(lag=0)
    finally:
        connections.close_all()  # this thread's


def call_command_output(*args: str) -> str:
    out = StringIO()
    call_command("pgmb_trace_export", *args, stdout=out)
    return out.getvalue().strip()


def test_attempts_passed_over_are_not_read_again_and_the_position_never_goes_back(
    spans, pg, make_recording_server, make_worker, make_queue
):
    server = make_recording_server()
    make_queue("#", worker=make_worker(endpoint=server.url()))
    with trace.get_tracer("test").start_as_current_span("publish"):
        pgmb.send("k", {"n": 1})
    asyncio.run(
        Dispatcher(conninfo_from_django("default"), Options(until_idle=True, max_seconds=120)).run()
    )
    assert len(server.requests) == 1
    position = "SELECT recorded_at, attempt_id FROM pgmb.trace_export"

    assert trace_export.export(lag=0) == trace_export.Exported(read=0, spans=0)
    [(recorded_at, _)] = pg.execute(position).fetchall()
    [(created_at,)] = pg.execute("SELECT created_at FROM pgmb_attempt").fetchall()
    assert recorded_at >= created_at  # pgmb_dispatch's attempt is behind it
    trace_export.export(lag=3600)
    assert pg.execute(position).fetchall()[0][0] == recorded_at
