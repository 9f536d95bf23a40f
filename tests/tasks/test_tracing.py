"""A trace continued by a pull consumer and by the Tasks worker (pgmb.tracing): the handler
runs in a CONSUMER span whose parent is the publisher's (the enqueuer's), or, for a batch,
linked to each traced message."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

import pgmb
from pgmb.consume import Consumer
from pgmb.models import Message, Queue
from pgmb.tasks.worker import TaskConsumer, ensure_queues
from tests.spans import named, traceparent
from tests.tasks import jobs


def test_a_task_runs_in_a_span_under_the_enqueuers(spans, transactional_db):
    [queue] = ensure_queues(["default"])
    with trace.get_tracer("a web request").start_as_current_span("POST /sum") as enqueuer:
        result = jobs.add.enqueue(2, 3)
    assert Message.objects.get(pk=result.id).headers["traceparent"] == traceparent(enqueuer)
    TaskConsumer(queue, vt=30, max_messages=1).run()
    result.refresh()
    assert result.return_value == 5
    [span] = named(spans, f"process {queue}")
    assert span.kind == SpanKind.CONSUMER
    assert span.parent.span_id == enqueuer.get_span_context().span_id
    assert span.attributes["messaging.message.id"] == result.id
    assert span.attributes["pgmb.attempt"] == 1


def test_an_untraced_task_gets_no_span_and_no_header(spans, transactional_db):
    [queue] = ensure_queues(["default"])
    result = jobs.add.enqueue(1, 1)
    assert Message.objects.get(pk=result.id).headers == {}
    TaskConsumer(queue, vt=30, max_messages=1).run()
    assert spans.get_finished_spans() == ()


def test_a_failing_handler_marks_its_span(spans, transactional_db):
    queue = Queue.objects.create(name="pulled", binding_key="#", worker=None, max_retries=0)
    seen = []

    def handler(message):
        seen.append(trace.get_current_span().get_span_context().trace_id)
        raise ValueError("no")

    with trace.get_tracer("test").start_as_current_span("publish") as publisher:
        pgmb.send("k", {"n": 1})
    Consumer(queue.name, handler, max_messages=1).run()
    [span] = named(spans, "process pulled")
    assert seen == [publisher.get_span_context().trace_id]
    assert span.status.status_code == StatusCode.ERROR
    assert span.events[0].name == "exception"


def test_a_batch_links_each_traced_message(spans, transactional_db):
    queue = Queue.objects.create(name="pulled", binding_key="#", worker=None)
    tracer = trace.get_tracer("test")
    publishers = []
    for n in range(2):
        with tracer.start_as_current_span(f"publish {n}") as publisher:
            pgmb.send("k", {"n": n})
        publishers.append(publisher.get_span_context())
    pgmb.send("k", {"n": "untraced"})
    batches = []
    Consumer(queue.name, batches.append, batch=3, max_messages=3).run()
    assert [len(b) for b in batches] == [3]
    [span] = named(spans, "process pulled")
    assert span.parent is None
    assert [link.context.span_id for link in span.links] == [p.span_id for p in publishers]
    assert span.attributes["messaging.batch.message_count"] == 3
