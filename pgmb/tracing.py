"""Trace context through pgmb with OpenTelemetry, when ``opentelemetry-api`` is installed
(the extra ``pgmb[otel]``; docs/tracing.md).

A publisher's current trace context goes into the message's headers (``traceparent`` and
``tracestate`` with the default propagator: whatever fields the configured one writes), so
it is stored with the message and reaches every queue the message is routed to. The
external dispatcher records a span per attempt, a child of the publisher's, and sends the
worker that span's context in place of the publisher's; a pull consumer (``pgmb_consume``,
the Tasks worker) runs its handler in a span continuing the trace. The in-database loop
sends the stored headers as they are: the worker's span is then the publisher's child;
its attempts become spans afterwards, made from the history by ``pgmb_trace_export``
(pgmb.trace_export).

Only messages that carry a trace context get spans: untraced traffic pays nothing. Without
the package this module imports nothing and every function here leaves things as they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any, TypeGuard

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind, StatusCode
except ImportError:  # the extra is not installed: tracing is off
    ENABLED = False
else:
    ENABLED = True

#: The instrumentation scope of pgmb's spans, and their messaging.system attribute.
SCOPE = SYSTEM = "pgmb"


_fields_of: tuple[object, frozenset[str]] = (None, frozenset())


def _fields() -> frozenset[str]:
    """The header names the configured propagator writes (lower case), kept while it is the
    one configured: building them from a composite propagator costs microseconds a call."""
    global _fields_of
    textmap = propagate.get_global_textmap()
    if _fields_of[0] is not textmap:
        _fields_of = (textmap, frozenset(field.lower() for field in textmap.fields))
    return _fields_of[1]


def recording() -> bool:
    """Whether spans made here go somewhere: the package is installed and a tracer provider
    was set up in this process (the SDK's, by ``opentelemetry-instrument`` or the project),
    not the API's stand-in that drops them."""
    if not ENABLED:
        return False
    return not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )


def flush() -> None:
    """Hand the spans made so far to the provider's exporters (a provider that batches them
    would otherwise keep the last ones until it is shut down)."""
    force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if force_flush is not None:
        force_flush()


def publish_headers() -> dict[str, str]:
    """The current trace context as message headers ({} outside a span, or without the
    package). Read once per publishing call: every message of a batch carries the same."""
    if not ENABLED or not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def with_headers(headers: Mapping[str, Any] | None, traced: Mapping[str, str]) -> Any:
    """``headers`` with the trace context added; a header the caller set is kept as given."""
    if not traced:
        return headers
    if headers is None:
        return dict(traced)
    if not isinstance(headers, Mapping):
        return headers  # refused by the publisher's own check, with its own message
    return {**traced, **headers}


def traced(headers: Mapping[str, Any] | None) -> TypeGuard[Mapping[str, Any]]:
    """Whether a stored message carries a trace context (its spans are recorded)."""
    return ENABLED and bool(headers) and not _fields().isdisjoint(headers)  # type: ignore[arg-type]


def _parent(headers: Mapping[str, Any]) -> Any:
    return propagate.extract({k: v for k, v in headers.items() if isinstance(v, str)})


class AttemptSpan:
    """The span of one delivery attempt (kind CLIENT): the external dispatcher's, started as
    its request is, or one of the in-database loop's, made afterwards from the history
    (pgmb.trace_export) with the attempt's times (nanoseconds since the epoch)."""

    def __init__(
        self,
        headers: Mapping[str, Any],
        *,
        queue: str,
        message_id: str,
        attempt: int,
        start_time: int | None = None,
    ) -> None:
        self.span = trace.get_tracer(SCOPE).start_span(
            f"deliver {queue}",
            context=_parent(headers),
            kind=SpanKind.CLIENT,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.destination.name": queue,
                "messaging.message.id": message_id,
                "pgmb.attempt": attempt,
            },
            start_time=start_time,
        )

    def inject(self, request_headers: MutableMapping[str, str]) -> None:
        """Put this span's context in the request, in place of the publisher's."""
        for name in [n for n in request_headers if n.lower() in _fields()]:
            del request_headers[name]
        propagate.inject(request_headers, context=trace.set_span_in_context(self.span))

    def end(
        self,
        status: int | None,
        duration_ms: float,
        error: str,
        ok: bool,
        end_time: int | None = None,
    ) -> None:
        span = self.span
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        span.set_attribute("pgmb.duration_ms", duration_ms)
        if not ok:
            span.set_status(StatusCode.ERROR, error[:200])
        span.end(end_time=end_time)


@contextlib.contextmanager
def consume_span(queue: str, messages: Sequence[Any]) -> Iterator[None]:
    """The span a pull consumer's handler runs in (kind CONSUMER): a child of the one
    message's publisher, or, for a batch, linked to each traced message's publisher. None
    when no message is traced."""
    contexts = [m.headers for m in messages if traced(m.headers)]
    if not contexts:
        yield
        return
    parent: Any = None
    links: list[Any] = []
    if len(messages) == 1:
        parent = _parent(contexts[0])
    else:
        for headers in contexts:
            span_context = trace.get_current_span(_parent(headers)).get_span_context()
            links.append(Link(span_context))
    attributes: dict[str, Any] = {"messaging.system": SYSTEM, "messaging.destination.name": queue}
    if len(messages) == 1:
        attributes["messaging.message.id"] = str(messages[0].message_id)
        attributes["pgmb.attempt"] = messages[0].read_ct
    else:
        attributes["messaging.batch.message_count"] = len(messages)
    tracer = trace.get_tracer(SCOPE)
    with tracer.start_as_current_span(
        f"process {queue}",
        context=parent,
        kind=SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        record_exception=True,
        set_status_on_exception=True,
    ):
        yield
