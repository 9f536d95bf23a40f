"""How soon a running dispatcher delivers again after the database restarts.

Each round stops the throwaway cluster for ``--outage`` seconds and starts it again. ``up``
is the first moment a new connection succeeds; a message published then is delivered by
the dispatcher that was running all along (``pgmb_dispatch`` as a service), and the figure
is the time from ``up`` to its arrival at the endpoint. The baseline, in the same run: a
dispatcher process started at ``up`` (what a supervisor restarting a crashed one gives),
delivering one message published just before. Goal: at most 1 s after ``up``.

Run with ``scripts/with-cluster.sh .venv/bin/python bench/reconnect.py`` (it needs
``PGMB_CLUSTER_DIR`` to restart the cluster); ``make bench`` does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import endpoints, harness  # noqa: E402

CLUSTER = ROOT / "scripts" / "pgcluster.sh"
#: The running dispatcher serves the first queue, the baseline's fresh one the second.
SERVICE, FRESH = "reconnect_queue", "fresh_queue"
KEYS = {SERVICE: "reconnect.bench", FRESH: "fresh.bench"}


def _dispatcher(queue: str, *options: str) -> list[str]:
    return [sys.executable, "-m", "django", "pgmb_dispatch", "--queue", queue, *options]


def _send(queue: str) -> str:
    """Publish one message on a new connection (the old ones died with the server)."""
    with psycopg.connect(dbname=os.environ["PGMB_BENCH_DB"], autocommit=True) as conn:
        row = conn.execute(
            "SELECT pgmb.send(pgmb.uuid_v7(), %s, '1'::jsonb)::text", (KEYS[queue],)
        ).fetchone()
    assert row is not None
    return str(row[0])


def _arrival(recorder: endpoints.Recorder, message_id: str, seconds: float = 60.0) -> float:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (at := recorder.arrivals().get(message_id)) is not None:
            return at
        time.sleep(0.005)
    raise RuntimeError(f"message {message_id} not delivered within {seconds:g}s")


def _restart(cluster: str, outage: float) -> float:
    """Stop the cluster, wait ``outage`` seconds, start it; when it accepts connections."""
    subprocess.run([str(CLUSTER), "stop", cluster], check=True, capture_output=True)
    time.sleep(outage)
    subprocess.run([str(CLUSTER), "start", cluster], check=True, capture_output=True)
    while True:
        try:
            psycopg.connect(dbname=os.environ["PGMB_BENCH_DB"], connect_timeout=1).close()
            return time.time()
        except psycopg.OperationalError:
            time.sleep(0.001)


def reconnection(recorder: endpoints.Recorder, cluster: str, outage: float) -> float:
    from django.db import connections

    connections.close_all()
    up = _restart(cluster, outage)
    message_id = _send(SERVICE)
    return _arrival(recorder, message_id) - up


def fresh_start(recorder: endpoints.Recorder) -> float:
    message_id = _send(FRESH)
    started = time.time()
    proc = subprocess.Popen(
        _dispatcher(FRESH, "--until-idle"),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        return _arrival(recorder, message_id) - started
    finally:
        _, err = proc.communicate(timeout=60)
        if proc.returncode:
            raise RuntimeError(f"pgmb_dispatch --until-idle failed: {err.decode()}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--outage", type=float, default=3.0, help="seconds the server is down")
    parser.add_argument("--db", default="pgmb_bench_reconnect", help="scratch database to create")
    args = parser.parse_args(argv)
    cluster = os.environ.get("PGMB_CLUSTER_DIR")
    if not cluster:
        print("needs PGMB_CLUSTER_DIR: run under scripts/with-cluster.sh", file=sys.stderr)
        return 2

    with harness.scratch_database(args.db), endpoints.recorder() as recorder:
        from pgmb.models import Queue, Worker

        worker = Worker.objects.create(name="reconnect_worker", endpoint=recorder.url())
        for queue, key in KEYS.items():
            Queue.objects.create(name=queue, binding_key=key, worker=worker)
        harness.print_machine(outage=f"{args.outage:g} s, {args.rounds} rounds")
        service = subprocess.Popen(
            _dispatcher(SERVICE, "--poll-interval", "1"),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        samples: dict[str, list[float]] = {"reconnect": [], "fresh": []}
        try:
            _arrival(recorder, _send(SERVICE))  # the service is up and delivering
            for _ in range(args.rounds):
                samples["reconnect"].append(reconnection(recorder, cluster, args.outage))
                samples["fresh"].append(fresh_start(recorder))
        finally:
            service.terminate()
            service.wait(60)

    def show(label: str, values: list[float], baseline: list[float] | None = None) -> None:
        med = statistics.median(values)
        ratio = f"{med / statistics.median(baseline):6.2f}" if baseline else " " * 6
        print(f"  {label:<52} {med * 1000:8.0f} ms  ({min(values) * 1000:.0f}-"
              f"{max(values) * 1000:.0f}) {ratio}")  # fmt: skip

    print(f"\n  {'seconds from the server accepting connections to delivery':<52} "
          f"{'median':>11}  (range)  ratio")  # fmt: skip
    show("a new dispatcher process (baseline)", samples["fresh"])
    show("the running dispatcher, reconnecting", samples["reconnect"], samples["fresh"])
    worst = max(samples["reconnect"])
    print(
        f"  goal: every round <= 1000 ms: {'met' if worst <= 1.0 else 'NOT MET'}"
        f" (worst {worst * 1000:.0f} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
