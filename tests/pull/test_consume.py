"""``manage.py pgmb_consume`` as a real process: per message and per batch, acks on
return, retries and dead letters on exceptions, wake-ups by NOTIFY, graceful stops, the
messages in hand kept invisible while the handler runs, a database waited for."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection

import pgmb
from pgmb import held_messages, pull
from pgmb.models import Attempt, DeadLetter, Delivery, DispatcherProcess
from tests.processes import StderrLines, closed_to_connections
from tests.waiting import wait_until


@pytest.fixture
def out(tmp_path) -> Path:
    return tmp_path / "handled.jsonl"


def _lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def consume(manage_process, out, tmp_path) -> Callable[..., subprocess.Popen]:
    env = {"PGMB_CONSUME_OUT": str(out), "PGMB_CONSUME_GATE": str(tmp_path / "gate")}

    def start(*args: str) -> subprocess.Popen:
        return manage_process("pgmb_consume", *args, env=env)

    return start


def _sleeping() -> bool:
    """A consumer is registered and marked waiting (publishers notify it)."""
    return DispatcherProcess.objects.filter(kind="consumer", stopped_at=None, waiting=True).exists()


def _stop(proc: subprocess.Popen) -> tuple[str, str]:
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    return stdout, stderr


def test_handles_each_message_acks_retries_and_dead_letters(consume, make_pull_queue, out):
    queue = make_pull_queue(max_retries=1, backoff_base=0, backoff_max=0)
    for n in range(4):
        pgmb.send("k", {"n": n, "fail": n == 2})
    proc = consume(queue.name, "--handler", "tests.pull.handlers.record", "--poll-interval", "600")
    wait_until(lambda: DeadLetter.objects.filter(queue=queue).exists(), message="a dead letter")
    wait_until(lambda: not Delivery.objects.filter(queue=queue).exists(), message="all settled")
    # Failed twice (1 + max_retries), the error recorded each time; the others acked once.
    assert sorted((b["body"]["n"], b["read_ct"]) for b in _lines(out)) == [
        (0, 1),
        (1, 1),
        (2, 1),
        (2, 2),
        (3, 1),
    ]
    failures = Attempt.objects.filter(queue=queue).exclude(outcome="ack").order_by("attempt")
    assert [(a.outcome, a.error) for a in failures] == [
        ("retry", "ValueError: refused 2"),
        ("dead", "ValueError: refused 2"),
    ]
    assert Attempt.objects.filter(queue=queue, outcome="ack").count() == 3
    # Waiting now, with a poll every 10 minutes: a new message is here by NOTIFY.
    wait_until(_sleeping, message="the consumer to wait")
    pgmb.send("k", {"n": 10})
    wait_until(lambda: len(_lines(out)) == 6, message="the new message handled")
    stdout, _ = _stop(proc)
    assert "4 deleted, 2 failed" in stdout
    assert DispatcherProcess.objects.get(kind="consumer").stopped_at is not None


def test_handles_batches(consume, make_pull_queue, out):
    queue = make_pull_queue(max_retries=0)
    pgmb.send_batch(("k", {"n": n, "fail": n == 7}) for n in range(8))
    proc = consume(queue.name, "--handler", "tests.pull.handlers.record_batch", "--batch", "3")
    wait_until(lambda: not Delivery.objects.filter(queue=queue).exists(), message="all settled")
    batches = _lines(out)
    assert [[b["n"] for b in batch] for batch in batches] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    # The last batch failed as a whole: with no retries both are dead letters.
    assert (
        sorted(DeadLetter.objects.filter(queue=queue).values_list("last_error", flat=True))
        == ["RuntimeError: a bad batch"] * 2
    )
    assert Attempt.objects.filter(queue=queue, outcome="ack").count() == 6
    _stop(proc)


def test_sigterm_finishes_the_message_in_hand_and_hands_back_the_rest(
    consume, make_pull_queue, out, tmp_path
):
    queue = make_pull_queue()
    pgmb.send_batch(("k", {"n": n}) for n in range(5))
    proc = consume(queue.name, "--handler", "tests.pull.handlers.held")
    wait_until(lambda: _lines(out), message="the first message in the handler")
    proc.send_signal(signal.SIGTERM)
    (tmp_path / "gate").touch()
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert "1 deleted, 0 failed" in stdout
    assert [line["body"]["n"] for line in _lines(out)] == [0]
    # The four read with it and not handled are visible again at once.
    assert sorted(m.body["n"] for m in pull.read(queue.name, 30, 10)) == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["nope", "--handler", "tests.pull.handlers.record"], "queue 'nope' does not exist"),
        (["PUSH", "--handler", "tests.pull.handlers.record"], "is not a pull queue"),
        (["PULL", "--handler", "tests.pull.handlers.missing"], "cannot import the handler"),
        (["PULL", "--handler", "tests.pull.handlers.NOT_CALLABLE"], "is not callable"),
        (["PULL", "--handler", "tests.pull.handlers.record", "--batch", "0"], "invalid"),
    ],
)
def test_bad_arguments_stop_with_a_clear_error(consume, make_pull_queue, make_queue, args, error):
    pull_name, push_name = make_pull_queue().name, make_queue().name
    args = [{"PULL": pull_name, "PUSH": push_name}.get(a, a) for a in args]
    proc = consume(*args)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert error in stderr
    assert not DispatcherProcess.objects.exists()


def test_a_lost_connection_is_waited_out_and_consuming_goes_on(consume, make_pull_queue, out):
    queue = make_pull_queue()
    pgmb.send("k", {"n": 1})
    proc = consume(queue.name, "--handler", "tests.pull.handlers.record", "--poll-interval", "600")
    wait_until(lambda: len(_lines(out)) == 1, message="the first message handled")
    wait_until(_sleeping, message="the consumer to wait")
    first = DispatcherProcess.objects.get(kind="consumer")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
    # It registers again on a new connection, and is woken by NOTIFY on it.
    wait_until(
        lambda: (
            DispatcherProcess.objects.filter(kind="consumer", waiting=True)
            .exclude(pk=first.pk)
            .exists()
        ),
        message="the consumer to reconnect and wait again",
    )
    pgmb.send("k", {"n": 2})
    wait_until(lambda: len(_lines(out)) == 2, message="the message after the outage handled")
    assert [line["body"]["n"] for line in _lines(out)] == [1, 2]
    # The handler writes its line before it returns, and the delete comes after.
    wait_until(lambda: not Delivery.objects.filter(queue=queue).exists(), message="the ack")
    _, stderr = _stop(proc)
    assert "connection to the database lost" in stderr
    assert "reconnected to the database" in stderr


# Keeping what it holds: the visibility timeout of the messages in hand is extended while
# the handler runs (pgmb.held_messages), on a connection named for it.


def _terminate(proc: subprocess.Popen) -> str:
    """SIGTERM, then the exit status 0 and stdout (stderr is read by a :class:`_Stderr`)."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    return proc.stdout.read()


def _db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def _extensions_seen(delivery_id: int, seen: list) -> int:
    """Records the delivery's visibility timeout when it moved; fails if it was read again
    meanwhile. Returns how often it moved forward."""
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.attempts == 1, "read again while the handler held it"
    if delivery.available_at != seen[-1]:
        assert delivery.available_at > seen[-1]
        seen.append(delivery.available_at)
    return len(seen) - 1


def test_a_handler_longer_than_the_visibility_timeout_keeps_its_message(
    consume, make_pull_queue, out, tmp_path
):
    queue = make_pull_queue()
    pgmb.send("k", {"n": 1})
    proc = consume(queue.name, "--handler", "tests.pull.handlers.held", "--vt", "3")
    wait_until(lambda: _lines(out), message="the message in the handler")
    delivery = Delivery.objects.get(queue=queue)
    # The end of the read's own timeout: the handler is still running well past it.
    seen = [delivery.available_at]
    stolen: list = []

    def held_past_its_first_timeout() -> bool:
        # Another client reads the same queue all along: it never gets the message.
        stolen.extend(pull.read(queue.name, 30, 10))
        assert not stolen, "another reader got the message the handler holds"
        return _extensions_seen(delivery.pk, seen) >= 2 and _db_now() > seen[0]

    wait_until(
        held_past_its_first_timeout,
        message=lambda: f"two extensions and the first timeout over (moved {len(seen) - 1})",
    )
    (tmp_path / "gate").touch()
    wait_until(lambda: not Delivery.objects.filter(queue=queue).exists(), message="the ack")
    assert [line["read_ct"] for line in _lines(out)] == [1]
    assert list(Attempt.objects.filter(queue=queue).values_list("outcome", flat=True)) == ["ack"]
    assert "1 deleted, 0 failed" in _stop(proc)[0]


def test_a_consumer_busy_in_a_long_handler_keeps_beating(
    manage_process, make_pull_queue, out, tmp_path
):
    """Its loop is blocked in the handler; the held messages' thread sends the heartbeats,
    so the admin does not show a working consumer as gone."""
    queue = make_pull_queue()
    pgmb.send("k", {"n": 1})
    env = {
        "PGMB_CONSUME_OUT": str(out),
        "PGMB_CONSUME_GATE": str(tmp_path / "gate"),
        "PGMB_TEST_HEARTBEAT_INTERVAL": "0.2",
    }
    # A long visibility timeout: no extension is due while the test runs, only heartbeats.
    proc = manage_process(
        "pgmb_consume", queue.name, "--handler", "tests.pull.handlers.held", "--vt", "600", env=env
    )
    wait_until(lambda: _lines(out), message="the message in the handler")
    consumer = DispatcherProcess.objects.get(kind="consumer", stopped_at=None)
    beats = [consumer.heartbeat_at]

    def beaten_twice_while_handling() -> bool:
        consumer.refresh_from_db()
        if consumer.heartbeat_at > beats[-1]:
            beats.append(consumer.heartbeat_at)
        return len(beats) > 2 and consumer.in_flight == 1

    wait_until(beaten_twice_while_handling, message=lambda: f"heartbeats ({len(beats) - 1})")
    assert not (tmp_path / "gate").exists() and len(_lines(out)) == 1  # still in the handler
    (tmp_path / "gate").touch()
    wait_until(lambda: not Delivery.objects.filter(queue=queue).exists(), message="the ack")
    assert "1 deleted, 0 failed" in _stop(proc)[0]


def test_a_killed_consumer_lets_its_message_come_back_to_another(consume, make_pull_queue, out):
    queue = make_pull_queue()
    pgmb.send("k", {"n": 1})
    first = consume(queue.name, "--handler", "tests.pull.handlers.held", "--vt", "2")
    wait_until(lambda: _lines(out), message="the message in the first consumer's handler")
    delivery = Delivery.objects.get(queue=queue)
    seen = [delivery.available_at]
    wait_until(lambda: _extensions_seen(delivery.pk, seen) >= 1, message="an extension")
    first.kill()
    first.wait(timeout=60)
    # Nothing extends it now: it is visible again at the end of the last extension, and
    # read by the next consumer.
    second = consume(queue.name, "--handler", "tests.pull.handlers.record")
    wait_until(
        lambda: not Delivery.objects.filter(queue=queue).exists(),
        message="the message handled by the second consumer",
    )
    assert [(line["id"], line["read_ct"]) for line in _lines(out)] == [
        (delivery.pk, 1),
        (delivery.pk, 2),
    ]
    assert list(Attempt.objects.filter(queue=queue).values_list("outcome", flat=True)) == ["ack"]
    assert "1 deleted, 0 failed" in _stop(second)[0]


def test_failed_extensions_are_logged_and_never_stop_the_handler_or_the_consumer(
    consume, make_pull_queue, out, tmp_path
):
    queue = make_pull_queue()
    pgmb.send("k", {"n": 1})
    proc = consume(queue.name, "--handler", "tests.pull.handlers.held", "--vt", "2")
    stderr = StderrLines(proc)
    wait_until(lambda: _lines(out), message="the message in the handler")
    delivery = Delivery.objects.get(queue=queue)
    seen = [delivery.available_at]
    wait_until(lambda: _extensions_seen(delivery.pk, seen) >= 1, message="an extension")
    # Its connection lost: logged, connected again, extending again.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            [held_messages.APPLICATION_NAME],
        )
        assert (True,) in cursor.fetchall()
    wait_until(
        lambda: stderr.has("could not extend the visibility timeouts"), message="the failure"
    )
    moved = _extensions_seen(delivery.pk, seen)
    wait_until(lambda: _extensions_seen(delivery.pk, seen) > moved, message="extended again")
    # Logged once the extension is committed: the line may follow what the test saw.
    wait_until(
        lambda: stderr.has(f"extending the visibility timeouts of {queue.name} again"),
        message="the recovery logged",
    )
    # Another client settles it: logged, and let go.
    assert pull.delete(queue.name, [delivery.pk]) == [delivery.pk]
    wait_until(
        lambda: stderr.has(f"message {delivery.pk} of {queue.name} is not kept invisible"),
        message="the message let go",
    )
    wait_until(lambda: stderr.has("it is no longer in the queue"), message="why")
    (tmp_path / "gate").touch()
    # The handler returned (its delete found nothing left) and the consumer goes on.
    pgmb.send("k", {"n": 2})
    wait_until(lambda: len(_lines(out)) == 2, message="the next message handled")
    wait_until(lambda: not Delivery.objects.filter(queue=queue).exists(), message="its ack")
    assert proc.poll() is None
    assert "1 deleted, 0 failed" in _terminate(proc)


# The first connection: a database that does not accept connections yet is waited for.


def test_waits_for_the_database_at_the_start(consume, make_pull_queue, out):
    queue = make_pull_queue()
    pgmb.send("k", {"n": 1})
    with closed_to_connections():
        proc = consume(queue.name, "--handler", "tests.pull.handlers.record")
        stderr = StderrLines(proc)
        wait_until(lambda: stderr.has("cannot reach the database"), message="a refusal")
        assert stderr.has("is not currently accepting connections")
        assert proc.poll() is None
        assert not DispatcherProcess.objects.exists()
    wait_until(lambda: _lines(out), message="the message handled once the database is back")
    wait_until(lambda: not Delivery.objects.filter(queue=queue).exists(), message="the ack")
    assert DispatcherProcess.objects.filter(kind="consumer", stopped_at=None).count() == 1
    assert "reached the database" in "".join(stderr.lines)
    stdout = _terminate(proc)
    assert "consuming" in stdout
    assert "1 deleted, 0 failed" in stdout


def test_a_consumer_waiting_for_the_database_stops_on_sigterm(consume, make_pull_queue):
    queue = make_pull_queue()
    with closed_to_connections():
        proc = consume(queue.name, "--handler", "tests.pull.handlers.record")
        stderr = StderrLines(proc)
        wait_until(lambda: stderr.has("cannot reach the database"), message="a refusal")
        stdout = _terminate(proc)
    assert "stopped before the database could be reached" in stdout
    assert not DispatcherProcess.objects.exists()
