"""Metrics for machines: pgmb's per-queue and per-worker figures, and their Prometheus text.

The figures come from the SQL functions ``pgmb.metrics_all()``, ``pgmb.metrics(name)`` and
``pgmb.worker_metrics()`` (one statement each, ``pgmb/sql/queries/metrics.sql``)::

    from pgmb import metrics
    snapshot = metrics.collect()          # every queue and worker, in one transaction
    text = metrics.render(snapshot)       # the Prometheus text exposition format 0.0.4

The endpoint (:mod:`pgmb.views`, ``/metrics``) and ``manage.py pgmb_stats`` use them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.db import transaction

from . import conf, sql
from .db.statements import Call, run

T = TypeVar("T")

#: The Content-Type of the text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    """One queue, as ``pgmb.metrics()`` returns it (ages in seconds since publishing)."""

    queue_name: str
    #: Live deliveries: ready, delayed and leased.
    queue_length: int
    #: Ready and due now.
    queue_visible_length: int
    #: Since the newest live delivery was published; None when there is none.
    newest_msg_age_sec: float | None
    #: Since the oldest delivery that is due was published; None when none is due.
    oldest_msg_age_sec: float | None
    #: Deliveries the queue ever had: live, dead and acknowledged.
    total_messages: int
    leased: int
    #: Waiting for another attempt (attempts > 0, not leased).
    retrying: int
    dead_letters: int
    delivered_last_hour: int
    failed_last_hour: int
    paused: bool
    scrape_time: datetime
    #: False: a pull queue whose deletes leave no history (keep_history off): its
    #: acknowledged messages are missing from delivered_last_hour and total_messages.
    keeps_history: bool = True


@dataclass(frozen=True, slots=True)
class WorkerMetrics:
    """One worker, over the attempts of all its queues (``pgmb.worker_metrics()``)."""

    worker_name: str
    active: bool
    requests_last_hour: int
    successes_last_hour: int
    #: successes / requests of the last hour; None without requests.
    success_rate: float | None
    p95_latency_ms: float | None
    last_success_at: datetime | None
    last_error_status: int | None
    last_error: str | None
    #: The newest failure of the last 24 hours (the look-back is bounded).
    last_error_at: datetime | None
    #: Failures since the last success, counted over 24 hours at most.
    consecutive_failures: int
    scrape_time: datetime
    #: The circuit breaker: off (no limit set), closed, open or half_open; why; since when;
    #: open: the end of its cool-down, half-open: until when its probe may take.
    breaker_state: str = "off"
    breaker_reason: str = ""
    breaker_since: datetime | None = None
    breaker_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    queues: tuple[QueueMetrics, ...]
    workers: tuple[WorkerMetrics, ...]

    def as_json(self) -> dict[str, list[dict[str, Any]]]:
        """Plain JSON values (times in ISO 8601)."""

        def plain(row: Any) -> dict[str, Any]:
            return {
                k: v.isoformat() if isinstance(v, datetime) else v for k, v in asdict(row).items()
            }

        return {
            "queues": [plain(q) for q in self.queues],
            "workers": [plain(w) for w in self.workers],
        }


def _records(cls: type[T]) -> Callable[[list[str], list[tuple[Any, ...]]], list[T]]:
    """A reader that builds ``cls`` records by column name."""

    def read(names: list[str], rows: list[tuple[Any, ...]]) -> list[T]:
        return [cls(**dict(zip(names, row, strict=True))) for row in rows]

    return read


def _read(name: str, params: dict[str, Any], cls: type[T], using: str | None) -> list[T]:
    return run(Call(sql.query("metrics.sql", name), params, _records(cls)), using)


def queues(using: str | None = None, names: Sequence[str] | None = None) -> list[QueueMetrics]:
    """Every queue's metrics, by name; only the queues ``names`` lists if given."""
    if names is None:
        return _read("queues", {}, QueueMetrics, using)
    return _read("queues_named", {"names": list(names)}, QueueMetrics, using)


def queue(name: str, using: str | None = None) -> QueueMetrics:
    """One queue's metrics; an unknown name raises the database's error (SQLSTATE 42704)."""
    (row,) = _read("queue", {"queue": name}, QueueMetrics, using)
    return row


def workers(using: str | None = None, names: Sequence[str] | None = None) -> list[WorkerMetrics]:
    """Every worker's metrics, by name; only the workers ``names`` lists if given."""
    if names is None:
        return _read("workers", {}, WorkerMetrics, using)
    return _read("workers_named", {"names": list(names)}, WorkerMetrics, using)


def collect(using: str | None = None) -> Snapshot:
    """Every queue and worker, read in one transaction (one ``now()``: the same last hour)."""
    with transaction.atomic(using=using or conf.get().DATABASE):
        return Snapshot(tuple(queues(using)), tuple(workers(using)))


# The text exposition format (Prometheus 0.0.4).


def escape_label(value: str) -> str:
    """A label value: backslash, double quote and line feed escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """A HELP text: backslash and line feed escaped."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


@dataclass(frozen=True, slots=True)
class Family:
    """One metric: its name, type, help and how to read its value from a row."""

    name: str
    type: str  # "gauge" or "counter"
    help: str
    value: Callable[[Any], float | None]


QUEUE_FAMILIES: tuple[Family, ...] = (
    Family("pgmb_queue_length", "gauge", "Live deliveries: ready, delayed and leased.",
           lambda m: m.queue_length),
    Family("pgmb_queue_visible_length", "gauge", "Deliveries ready and due now.",
           lambda m: m.queue_visible_length),
    Family("pgmb_queue_newest_message_age_seconds", "gauge",
           "Seconds since the newest live delivery was published.",
           lambda m: m.newest_msg_age_sec),
    Family("pgmb_queue_oldest_message_age_seconds", "gauge",
           "Seconds since the oldest due delivery was published.",
           lambda m: m.oldest_msg_age_sec),
    Family("pgmb_queue_total_messages", "gauge",
           "Deliveries the queue ever had: live, dead and acknowledged "
           "(purges and pruned history lower it; no sample: the queue keeps no history).",
           lambda m: m.total_messages if m.keeps_history else None),
    Family("pgmb_queue_leased", "gauge", "Deliveries leased to a dispatcher.",
           lambda m: m.leased),
    Family("pgmb_queue_retrying", "gauge", "Deliveries waiting for another attempt.",
           lambda m: m.retrying),
    Family("pgmb_queue_dead_letters", "gauge", "Dead letters.", lambda m: m.dead_letters),
    Family("pgmb_queue_delivered_last_hour", "gauge",
           "Acknowledged attempts in the last hour (no sample: the queue keeps no history).",
           lambda m: m.delivered_last_hour if m.keeps_history else None),
    Family("pgmb_queue_failed_last_hour", "gauge", "Failed attempts in the last hour.",
           lambda m: m.failed_last_hour),
    Family("pgmb_queue_paused", "gauge", "1 when the queue is paused.", lambda m: m.paused),
    Family("pgmb_queue_keeps_history", "gauge",
           "0 when the queue's deletes leave no history (keep_history off): its delivered "
           "and total counts are unknown, and have no sample.",
           lambda m: m.keeps_history),
)  # fmt: skip

#: pgmb_worker_breaker_state's values.
BREAKER_STATE_VALUES = {"closed": 0, "open": 1, "half_open": 2}

WORKER_FAMILIES: tuple[Family, ...] = (
    Family("pgmb_worker_active", "gauge", "1 when the worker is active.", lambda w: w.active),
    Family("pgmb_worker_requests_last_hour", "gauge",
           "Attempts to the worker in the last hour.", lambda w: w.requests_last_hour),
    Family("pgmb_worker_successes_last_hour", "gauge",
           "Acknowledged attempts to the worker in the last hour.",
           lambda w: w.successes_last_hour),
    Family("pgmb_worker_success_ratio", "gauge",
           "Successes / requests of the last hour.", lambda w: w.success_rate),
    Family("pgmb_worker_latency_p95_seconds", "gauge",
           "95th percentile of the last hour's request durations.",
           lambda w: None if w.p95_latency_ms is None else w.p95_latency_ms / 1000),
    Family("pgmb_worker_last_success_timestamp_seconds", "gauge",
           "Unix time of the worker's last acknowledged attempt.",
           lambda w: None if w.last_success_at is None else w.last_success_at.timestamp()),
    Family("pgmb_worker_last_error_timestamp_seconds", "gauge",
           "Unix time of the worker's last failed attempt (24 hours look-back).",
           lambda w: None if w.last_error_at is None else w.last_error_at.timestamp()),
    Family("pgmb_worker_last_error_status", "gauge",
           "HTTP status of the worker's last failed attempt (0: no answer).",
           lambda w: None if w.last_error_at is None else (w.last_error_status or 0)),
    Family("pgmb_worker_consecutive_failures", "gauge",
           "Failed attempts since the worker's last success (24 hours look-back).",
           lambda w: w.consecutive_failures),
    Family("pgmb_worker_breaker_state", "gauge",
           "The worker's circuit breaker: 0 closed, 1 open, 2 half-open (no sample: off).",
           lambda w: BREAKER_STATE_VALUES.get(w.breaker_state)),
)  # fmt: skip


def render_families(
    families: Iterable[Family], rows: Sequence[Any], label: str, key: Callable[[Any], str]
) -> list[str]:
    """The lines of some metric families, one sample per row (a None value: no sample)."""
    lines = []
    for family in families:
        lines.append(f"# HELP {family.name} {escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for row in rows:
            value = family.value(row)
            if value is not None:
                labels = f'{label}="{escape_label(key(row))}"'
                lines.append(f"{family.name}{{{labels}}} {format_value(value)}")
    return lines


def render(snapshot: Snapshot) -> str:
    """The snapshot in the Prometheus text exposition format (version 0.0.4)."""
    lines = [
        *render_families(QUEUE_FAMILIES, snapshot.queues, "queue", lambda m: m.queue_name),
        *render_families(WORKER_FAMILIES, snapshot.workers, "worker", lambda w: w.worker_name),
    ]
    return "\n".join(lines) + "\n"
