"""Real dispatcher processes: rate limits across processes, crashes, graceful stops,
a database restart, wake-ups by NOTIFY and by polling."""

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection

import pgmb
from pgmb.models import Attempt, Delivery
from tests.httpserver import reply


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_rate_limit_holds_across_two_processes(spawn, recording_server, make_worker, make_queue):
    worker = make_worker(endpoint=recording_server.url(), rps=50)
    make_queue("a.#", worker=worker)
    make_queue("b.#", worker=worker)
    pgmb.send_batch((("a.x" if n % 2 else "b.x"), n) for n in range(1500))
    procs = [spawn("--max-seconds", "13", "--poll-interval", "0.05") for _ in range(2)]
    _wait(lambda: len(recording_server.requests) >= 1, 15, "the first request")
    time.sleep(1.0)  # measure 10 s of steady state
    before = len(recording_server.requests)
    time.sleep(10.0)
    in_ten_seconds = len(recording_server.requests) - before
    for proc in procs:
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    assert 450 <= in_ten_seconds <= 550
    ids = Counter(r.headers["pgmb-message-id"] for r in recording_server.requests)
    assert max(ids.values()) == 1
    # both processes took part
    assert len({r.peer for r in recording_server.requests}) >= 2


def test_two_dispatchers_never_deliver_a_message_twice(
    spawn, recording_server, make_worker, make_queue
):
    make_queue("#", worker=make_worker(endpoint=recording_server.url(), rps=100_000))
    ids = pgmb.send_batch(("k", n) for n in range(2000))
    procs = [spawn("--until-idle", "--concurrency", "16", "--batch", "20") for _ in range(2)]
    for proc in procs:
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    counts = Counter(r.headers["pgmb-message-id"] for r in recording_server.requests)
    assert set(counts) == {str(i) for i in ids}
    assert set(counts.values()) == {1}
    assert not Delivery.objects.exists()


def test_sigkill_mid_batch_loses_nothing(spawn, recording_server, make_worker, make_queue):
    recording_server.respond(reply(200, delay=0.3))
    make_queue(
        "#", worker=make_worker(endpoint=recording_server.url(), rps=100_000), lease_seconds=1.5
    )
    ids = pgmb.send_batch(("k", n) for n in range(60))
    victim = spawn("--concurrency", "20", "--batch", "20")
    _wait(lambda: len(recording_server.requests) >= 10, 15, "the victim's first requests")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    assert Delivery.objects.filter(state="leased").exists()  # it died holding leases
    rescuer = spawn("--until-idle", "--concurrency", "20", "--poll-interval", "0.1")
    assert rescuer.wait(timeout=60) == 0, rescuer.stderr.read()
    received = {r.headers["pgmb-message-id"] for r in recording_server.requests}
    assert received == {str(i) for i in ids}
    assert not Delivery.objects.exists()
    assert Attempt.objects.filter(outcome="expired").exists()


def test_sigterm_finishes_in_flight_and_releases_the_rest(
    spawn, recording_server, make_worker, make_queue
):
    recording_server.respond(reply(200, delay=1.0))
    make_queue("#", worker=make_worker(endpoint=recording_server.url(), rps=4, timeout=5))
    pgmb.send_batch(("k", n) for n in range(40))
    proc = spawn("--concurrency", "10", "--batch", "10")
    _wait(lambda: recording_server.in_flight >= 1, 15, "a request in flight")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0, proc.stderr.read()
    assert time.monotonic() - started < 5  # within the worker's HTTP timeout
    posted = len(recording_server.requests)
    assert Attempt.objects.filter(outcome="ack").count() == posted  # in-flight ones finished
    assert not Delivery.objects.filter(state="leased").exists()  # the rest were handed back
    assert Delivery.objects.count() == 40 - posted
    assert set(Delivery.objects.values_list("attempts", flat=True)) == {0}


def test_notify_wakes_a_dispatcher_at_once(spawn, recording_server, make_worker, make_queue):
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    proc = spawn("--poll-interval", "30")
    time.sleep(1.5)  # let it reach its idle wait
    latencies = []
    for n in range(5):
        sent = time.monotonic()
        pgmb.send("k", n)
        [*_, last] = recording_server.wait_for(n + 1, timeout=5)
        latencies.append(last.received_at - sent)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert max(latencies) < 0.5, latencies


def test_polling_delivers_without_notifications(
    spawn, recording_server, make_worker, make_queue, sql
):
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    proc = spawn("--poll-interval", "0.3")
    time.sleep(1.0)
    sql("SET pgmb.notify = off")
    pgmb.send("k", "silent")
    sql("RESET pgmb.notify")
    [request] = recording_server.wait_for(1, timeout=3)
    assert request.json() == "silent"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


@pytest.mark.skipif(not os.environ.get("PGMB_CLUSTER_DIR"), reason="needs the throwaway cluster")
def test_database_restart_during_dispatch_loses_nothing(
    spawn, recording_server, make_worker, make_queue
):
    recording_server.respond(reply(200, delay=0.02))
    make_queue(
        "#", worker=make_worker(endpoint=recording_server.url(), rps=100_000), lease_seconds=5
    )
    ids = pgmb.send_batch(("k", n) for n in range(400))
    proc = spawn("--until-idle", "--concurrency", "8", "--batch", "8", "--poll-interval", "0.2")
    _wait(lambda: len(recording_server.requests) >= 50, 30, "deliveries to start")
    connection.close()
    script = Path(__file__).resolve().parents[2] / "scripts" / "pgcluster.sh"
    subprocess.run([str(script), "restart", os.environ["PGMB_CLUSTER_DIR"]], check=True, timeout=60)
    assert proc.wait(timeout=90) == 0, proc.stderr.read()
    assert "database unavailable" in proc.stderr.read()
    received = {r.headers["pgmb-message-id"] for r in recording_server.requests}
    assert received == {str(i) for i in ids}
    assert not Delivery.objects.exists()


@pytest.mark.skipif(not os.environ.get("PGMB_CLUSTER_DIR"), reason="needs the throwaway cluster")
def test_sigterm_while_the_database_is_down_still_exits(
    spawn, recording_server, make_worker, make_queue
):
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    proc = spawn("--poll-interval", "0.2")
    pgmb.send("k", 1)
    recording_server.wait_for(1, timeout=10)
    connection.close()
    script = Path(__file__).resolve().parents[2] / "scripts" / "pgcluster.sh"
    cluster = os.environ["PGMB_CLUSTER_DIR"]
    subprocess.run([str(script), "stop", cluster], check=True, timeout=60)
    try:
        time.sleep(1.0)  # it notices and starts reconnecting
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        subprocess.run([str(script), "start", cluster], check=True, timeout=60, capture_output=True)
    assert "database unavailable" in proc.stderr.read()
