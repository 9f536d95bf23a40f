"""The Prometheus text exposition format, parsed back by a tiny parser of its own."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

import pytest

from pgmb import metrics

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(\w+)="((?:[^"\\]|\\.)*)"\} (\S+)$')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse(text: str) -> tuple[dict[str, tuple[str, str]], dict[tuple[str, str, str], float]]:
    """{name: (type, help)} and {(name, label, value): sample}, checking the layout."""
    assert text.endswith("\n")
    families: dict[str, tuple[str, str]] = {}
    samples: dict[tuple[str, str, str], float] = {}
    help_of: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            help_of[name] = re.sub(r"\\\\|\\n", lambda m: _UNESCAPE[m.group()], doc)
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert kind in ("gauge", "counter"), line
            assert name in help_of and name not in families, "HELP first, one TYPE per family"
            families[name] = (kind, help_of[name])
        else:
            match = _SAMPLE.match(line)
            assert match, f"not a sample line: {line!r}"
            name, label, raw, value = match.groups()
            assert name in families, "a sample after its family's TYPE"
            label_value = re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group()], raw)
            key = (name, label, label_value)
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = float(value)
    return families, samples


def test_render_round_trip(world):
    snapshot = metrics.collect()
    families, samples = parse(metrics.render(snapshot))
    assert families["pgmb_queue_length"] == ("gauge", "Live deliveries: ready, delayed and leased.")
    assert len(families) == len(metrics.QUEUE_FAMILIES) + len(metrics.WORKER_FAMILIES)
    busy = {k[0]: v for k, v in samples.items() if k[1:] == ("queue", "busy_queue")}
    assert busy == {
        "pgmb_queue_length": 8,
        "pgmb_queue_visible_length": 4,
        "pgmb_queue_newest_message_age_seconds": 1.0,
        "pgmb_queue_oldest_message_age_seconds": 200.0,
        "pgmb_queue_total_messages": 15,
        "pgmb_queue_leased": 1,
        "pgmb_queue_retrying": 2,
        "pgmb_queue_dead_letters": 2,
        "pgmb_queue_delivered_last_hour": 3,
        "pgmb_queue_failed_last_hour": 3,
        "pgmb_queue_paused": 0,
        "pgmb_queue_keeps_history": 1,
    }
    idle = {k[0]: v for k, v in samples.items() if k[1:] == ("queue", "idle_queue")}
    assert idle["pgmb_queue_paused"] == 1
    assert "pgmb_queue_oldest_message_age_seconds" not in idle  # NULL: no sample
    worker = {k[0]: v for k, v in samples.items() if k[1:] == ("worker", "metrics_worker")}
    w = next(w for w in snapshot.workers if w.worker_name == "metrics_worker")
    assert w.last_success_at is not None and w.last_error_at is not None
    assert worker == {
        "pgmb_worker_active": 1,
        "pgmb_worker_requests_last_hour": 7,
        "pgmb_worker_successes_last_hour": 4,
        "pgmb_worker_success_ratio": pytest.approx(4 / 7),
        "pgmb_worker_latency_p95_seconds": pytest.approx(0.067),
        "pgmb_worker_last_success_timestamp_seconds": w.last_success_at.timestamp(),
        "pgmb_worker_last_error_timestamp_seconds": w.last_error_at.timestamp(),
        "pgmb_worker_last_error_status": 503,
        "pgmb_worker_consecutive_failures": 2,
    }


def _queue(name: str, **kw) -> metrics.QueueMetrics:
    values = dict.fromkeys(
        ("queue_length", "queue_visible_length", "total_messages", "leased", "retrying"), 0
    )
    values |= dict.fromkeys(("dead_letters", "delivered_last_hour", "failed_last_hour"), 0)
    values |= {"newest_msg_age_sec": None, "oldest_msg_age_sec": None, "paused": False}
    values |= kw
    return metrics.QueueMetrics(queue_name=name, scrape_time=datetime.now(UTC), **values)


def test_label_values_are_escaped_and_read_back():
    # Queue names cannot hold these characters, but the format must survive any label.
    odd = 'a"b\\c\nd'
    text = metrics.render(metrics.Snapshot((_queue(odd, queue_length=3),), ()))
    assert 'pgmb_queue_length{queue="a\\"b\\\\c\\nd"} 3\n' in text
    _, samples = parse(text)
    assert samples[("pgmb_queue_length", "queue", odd)] == 3


@pytest.mark.parametrize(
    ("value", "text"),
    [(3, "3"), (True, "1"), (False, "0"), (0.5, "0.5"), (math.inf, "+Inf"), (math.nan, "NaN")],
)
def test_values(value, text):
    assert metrics.format_value(value) == text


def test_help_is_escaped():
    assert metrics.escape_help("a\\b\nc") == "a\\\\b\\nc"


def test_no_queue_no_worker_still_declares_the_families(db):
    families, samples = parse(metrics.render(metrics.collect()))
    assert "pgmb_queue_length" in families and "pgmb_worker_active" in families
    assert samples == {}
