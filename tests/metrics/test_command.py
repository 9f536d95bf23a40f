"""manage.py pgmb_stats: the tables and --json."""

from __future__ import annotations

import io
import json

from django.core.management import call_command


def run(*args) -> str:
    out = io.StringIO()
    call_command("pgmb_stats", *args, stdout=out)
    return out.getvalue()


def test_tables(world):
    lines = run().splitlines()
    assert lines[0] == "queues"
    header = lines[2].split()
    assert header[:4] == ["queue", "length", "due", "leased"]
    busy = next(line for line in lines if line.startswith("busy_queue"))
    # length due leased retrying dead ok/1h failed/1h total oldest-due newest state
    assert busy.split() == ["busy_queue", "8", "4", "1", "2", "2", "3", "3", "15", "3m", "1s",
                            "running"]  # fmt: skip
    assert next(line for line in lines if line.startswith("idle_queue")).split()[-3:] == [
        "-",
        "-",
        "paused",
    ]
    assert "workers" in lines
    worker = next(line for line in lines if line.startswith("metrics_worker"))
    cells = worker.split()
    assert cells[:6] == ["metrics_worker", "7", "4", "57.1%", "67.0", "2"]
    assert worker.endswith("503: HTTP 503: busy")
    idle = next(line for line in lines if line.startswith("idle_worker"))
    assert idle.split()[:7] == ["idle_worker", "0", "0", "-", "-", "0", "-"]


def test_columns_line_up(world):
    lines = run().splitlines()
    header, rule, busy = lines[2], lines[3], next(x for x in lines if x.startswith("busy_"))
    # Numbers are right-aligned under their headings, headings end where their rules do.
    assert header.index("total") + len("total") == busy.index(" 15 ") + len(" 15")
    assert rule.split("  ")[1] == "-" * len("length")


def test_json(world, sql):
    data = json.loads(run("--json"))
    assert set(data) == {"queues", "workers"}
    busy = next(q for q in data["queues"] if q["queue_name"] == "busy_queue")
    assert busy["queue_length"] == 8 and busy["total_messages"] == 15
    assert busy["oldest_msg_age_sec"] == 200.0 and busy["paused"] is False
    assert isinstance(busy["scrape_time"], str)
    worker = next(w for w in data["workers"] if w["worker_name"] == "metrics_worker")
    assert worker["consecutive_failures"] == 2 and worker["last_error_status"] == 503
    assert worker["last_error"] == "HTTP 503: busy"
    assert [w["worker_name"] for w in data["workers"]] == ["idle_worker", "metrics_worker"]


def test_nothing_yet(db):
    assert "(no queue)" in run() and "(no worker)" in run()
    assert json.loads(run("--json")) == {"queues": [], "workers": []}
