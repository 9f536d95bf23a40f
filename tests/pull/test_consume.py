"""``manage.py pgmb_consume`` as a real process: per message and per batch, acks on
return, retries and dead letters on exceptions, wake-ups by NOTIFY, graceful stops."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection

import pgmb
from pgmb import pull
from pgmb.models import Attempt, DeadLetter, Delivery, DispatcherProcess
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
    assert not Delivery.objects.filter(queue=queue).exists()
    _, stderr = _stop(proc)
    assert "connection to the database lost" in stderr
    assert "reconnected to the database" in stderr
