"""Real dispatcher processes: rate limits across processes, crashes, graceful stops,
a database restart, wake-ups by NOTIFY and by polling."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from functools import partial
from pathlib import Path

import psycopg
import pytest
from django.db import connection

import pgmb
from pgmb.db.conninfo import conninfo_from_django
from pgmb.models import Attempt, DeadLetter, Delivery, DispatcherProcess, Worker
from tests.httpserver import held, reply
from tests.processes import ROOT
from tests.waiting import wait_until


def _dispatchers_idle(count: int = 1) -> bool:
    """Whether ``count`` dispatchers are listening and have gone to wait (nothing due)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE query LIKE 'LISTEN pgmb%%'),"
            "       count(*) FILTER (WHERE query LIKE '%%pgmb.next_wakeup(%%' AND state = 'idle')"
            " FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        listening, waiting = cursor.fetchone()
    return listening >= count and waiting >= count


def _watch(stream) -> tuple[list[str], threading.Thread]:
    """Read a child's output line by line as it comes, in a thread (for waiting on a line)."""
    lines: list[str] = []
    thread = threading.Thread(target=lambda: lines.extend(iter(stream.readline, "")), daemon=True)
    thread.start()
    return lines, thread


def test_rate_limit_holds_across_two_processes(spawn, recording_server, make_worker, make_queue):
    rps, burst = 50, 0.2  # the dispatcher's default burst: the bucket holds rps * burst tokens
    worker = make_worker(endpoint=recording_server.url(), rps=rps, active=False)
    make_queue("a.#", worker=worker)
    make_queue("b.#", worker=worker)
    pgmb.send_batch((("a.x" if n % 2 else "b.x"), n) for n in range(1500))
    procs = [spawn("--poll-interval", "0.05") for _ in range(2)]
    wait_until(lambda: _dispatchers_idle(2), message="both dispatchers to start")
    # From here on the worker's bucket decides: it starts full and refills at rps, so by
    # any moment t at most rps * burst + rps * (t - opened) requests can have been claimed,
    # hence sent. (Two processes that each pace at rps would send twice as many.)
    opened = time.monotonic()
    Worker.objects.filter(pk=worker.pk).update(active=True)
    wait_until(
        lambda: len(recording_server.requests) >= 300,
        message=lambda: f"300 requests ({len(recording_server.requests)} arrived)",
    )
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    arrived = sorted(r.received_at for r in recording_server.requests)
    for count, at in enumerate(arrived, start=1):
        allowed = rps * burst + rps * (at - opened) + 1  # one token for clock rounding
        assert count <= allowed, f"request {count} arrived {at - opened:.2f} s after opening"
    worker.refresh_from_db()
    assert 0 <= worker.tokens <= rps * burst  # the shared bucket, never overdrawn
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
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    counts = Counter(r.headers["pgmb-message-id"] for r in recording_server.requests)
    assert set(counts) == {str(i) for i in ids}
    assert set(counts.values()) == {1}
    assert not Delivery.objects.exists()


def test_sigkill_mid_batch_loses_nothing(spawn, recording_server, make_worker, make_queue):
    recording_server.respond(reply(200, delay=0.3))
    make_queue(
        "#",
        worker=make_worker(endpoint=recording_server.url(), rps=100_000, timeout=1),
        lease_seconds=1.5,
    )
    ids = pgmb.send_batch(("k", n) for n in range(60))
    victim = spawn("--concurrency", "20", "--batch", "20")
    wait_until(lambda: len(recording_server.requests) >= 10, message="the victim's requests")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    assert Delivery.objects.filter(state="leased").exists()  # it died holding leases
    rescuer = spawn("--until-idle", "--concurrency", "20", "--poll-interval", "0.1")
    assert rescuer.wait(timeout=120) == 0, rescuer.stderr.read()
    received = {r.headers["pgmb-message-id"] for r in recording_server.requests}
    assert received == {str(i) for i in ids}
    assert not Delivery.objects.exists()
    # Its leases expired: counted if their requests had been marked started, else not.
    assert Attempt.objects.filter(outcome__in=("expired", "unsent")).exists()


def test_sigkill_spends_the_attempts_of_requests_in_flight_only(
    spawn, recording_server, make_worker, make_queue, sql
):
    """Rows claimed ahead of free slots were never sent: a crash must not spend their one
    attempt. The requests in flight when it died did use theirs (max_retries = 0: dead)."""
    gate = threading.Event()
    recording_server.respond(held(gate))
    queue = make_queue(
        "#",
        worker=make_worker(endpoint=recording_server.url(), rps=100_000, timeout=60),
        max_retries=0,
        lease_seconds=600,
    )
    ids = {str(i) for i in pgmb.send_batch(("k", n) for n in range(40))}
    # 8 slots and as many rows claimed ahead of them: 16 leased, 8 posted, all held.
    victim = spawn("--concurrency", "8", "--batch", "20")
    try:
        in_flight = {r.headers["pgmb-message-id"] for r in recording_server.wait_for(8)}
        wait_until(
            lambda: Delivery.objects.filter(started=True).count() == 8,
            message="the start marks of the 8 requests in flight",
        )
        assert Delivery.objects.filter(state="leased").count() == 16
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
    finally:
        gate.set()  # the dead dispatcher's requests end on the server's side too
    assert len(recording_server.requests) == 8
    started = {
        str(m) for m in Delivery.objects.filter(started=True).values_list("message_id", flat=True)
    }
    assert started == in_flight
    recording_server.clear()
    recording_server.respond(200)
    # Their leases run out (600 s, brought forward), and another dispatcher takes over.
    sql("UPDATE pgmb_delivery SET available_at = now() WHERE state = 'leased'")
    rescuer = spawn("--until-idle", "--concurrency", "8", "--poll-interval", "0.1")
    assert rescuer.wait(timeout=120) == 0, rescuer.stderr.read()
    assert not Delivery.objects.exists()
    dead = {
        str(m) for m in DeadLetter.objects.filter(queue=queue).values_list("message_id", flat=True)
    }
    assert dead == in_flight
    delivered = {r.headers["pgmb-message-id"] for r in recording_server.requests}
    assert delivered == ids - in_flight
    assert Counter(Attempt.objects.values_list("outcome", flat=True)) == {
        "dead": 8,  # in flight: their one attempt was spent
        "unsent": 8,  # claimed ahead, never sent: handed back, then delivered
        "ack": 32,
    }
    unsent = set(Attempt.objects.filter(outcome="unsent").values_list("message_id", flat=True))
    acked_first_time = Attempt.objects.filter(outcome="ack", attempt=1)
    assert {str(m) for m in unsent} <= {str(a.message_id) for a in acked_first_time}


def test_sigterm_finishes_in_flight_and_releases_the_rest(
    spawn, recording_server, make_worker, make_queue
):
    recording_server.respond(reply(200, delay=1.0))
    make_queue("#", worker=make_worker(endpoint=recording_server.url(), rps=4, timeout=5))
    pgmb.send_batch(("k", n) for n in range(40))
    proc = spawn("--concurrency", "10", "--batch", "10")
    wait_until(lambda: recording_server.in_flight >= 1, message="a request in flight")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    posted = len(recording_server.requests)
    assert 1 <= posted < 40  # it stopped rather than deliver everything (10 s at 4/s)
    assert Attempt.objects.filter(outcome="ack").count() == posted  # in-flight ones finished
    assert not Delivery.objects.filter(state="leased").exists()  # the rest were handed back
    assert Delivery.objects.count() == 40 - posted
    assert set(Delivery.objects.values_list("attempts", flat=True)) == {0}


def test_notify_wakes_a_dispatcher_at_once(spawn, recording_server, make_worker, make_queue):
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    # A poll every 10 minutes (heartbeats do not end the wait): whatever arrives within
    # the wait below was woken by NOTIFY.
    proc = spawn("--poll-interval", "600")
    wait_until(_dispatchers_idle, message="the dispatcher to reach its idle wait")
    for n in range(5):
        pgmb.send("k", n)
        [*_, last] = recording_server.wait_for(n + 1)
        assert last.json() == n
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert [r.json() for r in recording_server.requests] == [0, 1, 2, 3, 4]


def _publisher() -> psycopg.Connection:
    return psycopg.connect(**conninfo_from_django("default"), autocommit=True)


def _marked_waiting() -> bool:
    return DispatcherProcess.objects.filter(stopped_at=None, waiting=True).exists()


def test_a_publisher_in_flight_as_the_dispatcher_goes_idle_is_not_missed(
    spawn, recording_server, make_worker, make_queue
):
    """Its check for waiting dispatchers ran before the dispatcher's mark, so its commit
    sends no NOTIFY; the dispatcher must not sleep before it sees the message."""
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    with _publisher() as publisher:
        with publisher.transaction():
            publisher.execute("SELECT pgmb.send(pgmb.uuid_v7(), 'k', '\"early\"')")
            # A poll every 10 minutes (heartbeats do not end the wait): only the
            # dispatcher's own re-claims can find it.
            proc = spawn("--poll-interval", "600")
            wait_until(_marked_waiting, message="the dispatcher to mark itself waiting")
            assert not recording_server.requests
        [request] = recording_server.wait_for(1)
    assert request.json() == "early"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


def test_no_wake_up_is_lost_around_idle_and_busy_spells(
    spawn, recording_server, make_worker, make_queue
):
    """One message at a time from three publishers: with one slot each delivery makes the
    dispatcher busy (its mark cleared) and then idle again (marked and settled), so every
    message is published close to a transition. A lost wake-up would wait for the poll."""
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    proc = spawn("--poll-interval", "600", "--concurrency", "1", "--batch", "1")
    wait_until(_dispatchers_idle, message="the dispatcher to reach its idle wait")
    rounds, publishers = 40, 3
    errors: list[BaseException] = []

    def delivered(body: int) -> bool:
        return body in {r.json() for r in recording_server.requests}

    def publish(p: int) -> None:
        try:
            with _publisher() as conn:
                for body in range(p * 1000, p * 1000 + rounds):
                    conn.execute("SELECT pgmb.send(pgmb.uuid_v7(), 'k', %s::jsonb)", [f"{body}"])
                    wait_until(partial(delivered, body), message=f"message {body} delivered")
        except BaseException as exc:  # reported by the test's own thread
            errors.append(exc)

    threads = [threading.Thread(target=publish, args=(p,)) for p in range(publishers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert sorted(r.json() for r in recording_server.requests) == sorted(
        p * 1000 + n for p in range(publishers) for n in range(rounds)
    )


def test_polling_delivers_without_notifications(
    spawn, recording_server, make_worker, make_queue, sql
):
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    proc = spawn("--poll-interval", "0.3")
    wait_until(_dispatchers_idle, message="the dispatcher to reach its idle wait")
    sql("SET pgmb.notify = off")
    pgmb.send("k", "silent")
    sql("RESET pgmb.notify")
    [request] = recording_server.wait_for(1)
    assert request.json() == "silent"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


@pytest.mark.skipif(not os.environ.get("PGMB_CLUSTER_DIR"), reason="needs the throwaway cluster")
def test_database_restart_during_dispatch_loses_nothing(
    spawn, recording_server, make_worker, make_queue
):
    recording_server.respond(reply(200, delay=0.02))
    make_queue(
        "#",
        worker=make_worker(endpoint=recording_server.url(), rps=100_000, timeout=2),
        lease_seconds=5,
    )
    ids = pgmb.send_batch(("k", n) for n in range(400))
    # Heartbeats every 0.2 s: some fall in the outage, and must not stop it.
    proc = spawn(
        "--until-idle",
        *["--concurrency", "8", "--batch", "8", "--poll-interval", "0.2"],
        extra_env={"PGMB_TEST_HEARTBEAT_INTERVAL": "0.2"},
    )
    wait_until(lambda: len(recording_server.requests) >= 50, message="deliveries to start")
    connection.close()
    script = Path(__file__).resolve().parents[2] / "scripts" / "pgcluster.sh"
    subprocess.run([str(script), "restart", os.environ["PGMB_CLUSTER_DIR"]], check=True, timeout=60)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    log = proc.stderr.read()
    assert "database unavailable" in log
    assert "database reconnected" in log  # an operator sees the outage end, too
    received = {r.headers["pgmb-message-id"] for r in recording_server.requests}
    assert received == {str(i) for i in ids}
    assert not Delivery.objects.exists()
    # It registered once, beat through the outage and said it stopped.
    [registration] = DispatcherProcess.objects.filter(pid=proc.pid)
    assert registration.stopped_at is not None and registration.delivered >= len(ids)


@pytest.mark.skipif(not os.environ.get("PGMB_CLUSTER_DIR"), reason="needs the throwaway cluster")
def test_sigterm_while_the_database_is_down_still_exits(
    spawn, recording_server, make_worker, make_queue
):
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    proc = spawn("--poll-interval", "0.2")
    stderr, reader = _watch(proc.stderr)
    pgmb.send("k", 1)
    recording_server.wait_for(1)
    connection.close()
    script = Path(__file__).resolve().parents[2] / "scripts" / "pgcluster.sh"
    cluster = os.environ["PGMB_CLUSTER_DIR"]
    subprocess.run([str(script), "stop", cluster], check=True, timeout=60)
    try:
        # It notices and starts reconnecting; then it is told to stop.
        wait_until(
            lambda: any("database unavailable" in line for line in stderr),
            message="the dispatcher to report the database unavailable",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        subprocess.run([str(script), "start", cluster], check=True, timeout=60, capture_output=True)
    reader.join(timeout=60)
    assert "dispatcher stopped" in "".join(stderr)


def test_until_idle_gives_up_on_an_unreachable_database(transactional_db):
    """A cron job or CI step running --until-idle must end, with an error, not hang."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    port = closed.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PGPORT": str(port),
    }
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "django",
                "pgmb_dispatch",
                "--until-idle",
                *["--give-up-after", "1"],
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        closed.close()
    assert result.returncode == 1
    assert "database unavailable" in result.stderr  # it did try again before giving up
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("CommandError: gave up: the database is unreachable for"), last
