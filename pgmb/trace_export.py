"""Spans of the in-database loop's attempts (docs/tracing.md; decision 0091).

The loop runs inside PostgreSQL, where there is no OpenTelemetry: it forwards a message's
stored trace context to the worker and records each attempt in the history, marked as its
own (``pgmb_attempt.indb``). ``manage.py pgmb_trace_export`` reads those attempts in the
order they were recorded and makes a span of each whose message carries a trace context,
as ``pgmb_dispatch`` makes one per attempt (:class:`pgmb.tracing.AttemptSpan`, the same
name, kind and attributes), a child of the publisher's span, with the attempt's times: it
ends when the outcome was recorded and lasts the request's duration.

Where it stands is a row of the database (``pgmb.trace_export``), moved in the transaction
that read the batch: a batch is exported once, whichever exporter runs, and a restart
goes on from there. Attempts are read ``lag`` seconds after they were recorded, so that
outcomes recorded but not yet committed are not passed over.

Without ``opentelemetry-api`` this module imports none of it (pgmb.tracing).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction

from . import conf, sql, tracing
from .db.statements import Call, run
from .db.values import jsonb

#: Seconds between an attempt's recording and its export: the loop commits its outcomes
#: right after writing them, so a batch older than this is committed (or never will be).
DEFAULT_LAG = 10.0
#: Attempts read (and spans made) in one transaction.
DEFAULT_BATCH = 500

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TracingUnavailable(Exception):
    """Spans cannot be made in this process: the package, or a tracer provider, is missing."""


def check_recording() -> None:
    """Raise :class:`TracingUnavailable`, saying what is missing, unless spans made here go
    to an exporter. Exporting without one would move the position past attempts whose spans
    went nowhere."""
    if not tracing.ENABLED:
        raise TracingUnavailable(
            "OpenTelemetry is not installed: pip install 'pgmb[otel]' (opentelemetry-api) "
            "and opentelemetry-sdk with an exporter"
        )
    if not tracing.recording():
        raise TracingUnavailable(
            "no OpenTelemetry tracer provider is set up in this process, so spans would go "
            "nowhere: run it under opentelemetry-instrument (with opentelemetry-sdk and an "
            "exporter) or set a provider up in your settings"
        )


@dataclass(frozen=True)
class Exported:
    """What a run of :func:`export` did."""

    #: Attempts of the loop read from the history (each read once).
    read: int
    #: Spans made: the attempts whose message carries a trace context.
    spans: int


def _statement(name: str) -> str:
    return sql.query("tracing.sql", name)


def _rows(names: list[str], rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [dict(zip(names, row, strict=True)) for row in rows]


def _nanoseconds(at: datetime) -> int:
    return (at - _EPOCH) // timedelta(microseconds=1) * 1000


def _span(row: dict[str, Any]) -> bool:
    """Make the span of one attempt; False when its message carries no trace context."""
    headers = jsonb(row["headers"])
    if not tracing.traced(headers):
        return False
    end = _nanoseconds(row["created_at"])
    duration_ms = row["duration_ms"] or 0.0
    status = row["status_code"]
    span = tracing.AttemptSpan(
        headers,
        queue=row["queue"],
        message_id=row["message_id"],
        attempt=row["attempt"],
        start_time=end - round(duration_ms * 1_000_000),
    )
    ok = status is not None and 200 <= status <= 299
    span.end(status, duration_ms, row["error"], ok, end_time=end)
    return True


def export_batch(
    *, batch: int = DEFAULT_BATCH, lag: float = DEFAULT_LAG, using: str | None = None
) -> Exported:
    """Read up to ``batch`` of the loop's attempts after the position and make their spans,
    in one transaction that moves the position past them. Spans go to the provider as they
    end: should the transaction then fail, the batch is read again (at least once).
    :class:`TracingUnavailable` where spans would go nowhere (nothing is read)."""
    check_recording()
    alias = using or conf.get().DATABASE
    with transaction.atomic(using=alias):
        run(Call(_statement("start"), {}, lambda names, rows: None), alias)
        position = run(Call(_statement("position"), {"lag": lag}, _rows), alias)[0]
        rows = run(
            Call(
                _statement("attempts"),
                {
                    "recorded_at": position["recorded_at"],
                    "attempt_id": position["attempt_id"],
                    "upto": position["upto"],
                    "batch": batch,
                },
                _rows,
            ),
            alias,
        )
        spans = sum(_span(row) for row in rows)
        if len(rows) < batch:
            params = {"upto": position["upto"]}
            run(Call(_statement("pass"), params, lambda names, rows: None), alias)
        else:
            last = rows[-1]
            params = {"recorded_at": last["created_at"], "attempt_id": last["id"]}
            run(Call(_statement("advance"), params, lambda names, rows: None), alias)
    return Exported(len(rows), spans)


def export(
    *, batch: int = DEFAULT_BATCH, lag: float = DEFAULT_LAG, using: str | None = None
) -> Exported:
    """Export every attempt recorded up to ``lag`` seconds ago, a batch at a time."""
    read = spans = 0
    while True:
        done = export_batch(batch=batch, lag=lag, using=using)
        read += done.read
        spans += done.spans
        if done.read < batch:
            break
    tracing.flush()
    return Exported(read, spans)
