"""``manage.py pgmb_stats``: every queue's and worker's metrics, as a table or JSON.

    manage.py pgmb_stats            # two tables: queues, workers
    manage.py pgmb_stats --json     # {"queues": [...], "workers": [...]}

The figures are those of ``pgmb.metrics_all()`` and ``pgmb.worker_metrics()`` (see
:mod:`pgmb.metrics`), read in one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import Error as DjangoDatabaseError

from pgmb import metrics
from pgmb.cli_args import database_alias
from pgmb.db.error_text import database_reason, one_line


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def _time(t: datetime | None) -> str:
    return "-" if t is None else t.strftime("%Y-%m-%d %H:%M:%S")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Aligned columns: text left, the rest right (numbers)."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        out = [
            cell.ljust(w) if i == 0 or i == len(cells) - 1 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


QUEUE_HEADER = (
    "queue", "length", "due", "leased", "retrying", "dead", "ok/1h", "failed/1h", "total",
    "oldest due", "newest", "state",
)  # fmt: skip
WORKER_HEADER = (
    "worker", "req/1h", "ok/1h", "success", "p95 ms", "fails in a row", "last success",
    "last error",
)  # fmt: skip


def queue_row(m: metrics.QueueMetrics) -> list[str]:
    return [
        m.queue_name,
        *(
            str(n)
            for n in (
                m.queue_length,
                m.queue_visible_length,
                m.leased,
                m.retrying,
                m.dead_letters,
                m.delivered_last_hour,
                m.failed_last_hour,
                m.total_messages,
            )
        ),
        _age(m.oldest_msg_age_sec),
        _age(m.newest_msg_age_sec),
        "paused" if m.paused else "running",
    ]


def worker_row(w: metrics.WorkerMetrics) -> list[str]:
    error = "-"
    if w.last_error_at is not None:
        status = w.last_error_status if w.last_error_status is not None else "no answer"
        error = f"{_time(w.last_error_at)} {status}: {one_line(w.last_error or '')[:60]}"
    return [
        w.worker_name + ("" if w.active else " (inactive)"),
        str(w.requests_last_hour),
        str(w.successes_last_hour),
        "-" if w.success_rate is None else f"{w.success_rate:.1%}",
        "-" if w.p95_latency_ms is None else f"{w.p95_latency_ms:.1f}",
        str(w.consecutive_failures),
        _time(w.last_success_at),
        error,
    ]


class Command(BaseCommand):
    help = "Print every queue's and worker's metrics as tables, or as JSON (--json)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json",
            action="store_true",
            help='One JSON object: {"queues": [...], "workers": [...]}.',
        )
        parser.add_argument(
            "--database", metavar="ALIAS", help="Database alias (default: PGMB['DATABASE'])."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        using = database_alias(options["database"])
        try:
            snapshot = metrics.collect(using)
        except DjangoDatabaseError as exc:
            raise CommandError(f"database error: {database_reason(exc)}") from exc
        if options["json"]:
            self.stdout.write(json.dumps(snapshot.as_json(), indent=2))
            return
        lines = ["queues", ""]
        if snapshot.queues:
            lines += table(QUEUE_HEADER, [queue_row(m) for m in snapshot.queues])
        else:
            lines.append("(no queue)")
        lines += ["", "workers", ""]
        if snapshot.workers:
            lines += table(WORKER_HEADER, [worker_row(w) for w in snapshot.workers])
        else:
            lines.append("(no worker)")
        self.stdout.write("\n".join(lines))
