"""``manage.py pgmb_tasks_worker`` as a real process: tasks enqueued with the framework's
API run, retry, succeed or fail, and their results say so."""

from __future__ import annotations

import signal
import socket
import subprocess
from collections.abc import Callable
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django_tasks import TaskResultStatus

from pgmb.models import DeadLetter, DispatcherProcess, Queue
from pgmb.tasks import UnroutedTask
from tests.processes import StderrLines, closed_to_connections
from tests.tasks import jobs
from tests.waiting import wait_until


@pytest.fixture
def spawn(manage_process) -> Callable[..., subprocess.Popen]:
    """Start a manage.py command as a real process against the test database."""
    return manage_process


def _queues(**settings) -> None:
    """Create the backend's pull queues as a deployment would, then tune them."""
    out = StringIO()
    call_command("pgmb_tasks_worker", "--create-queues", stdout=out)
    assert out.getvalue().strip() == "queues ready: tasks_default, tasks_emails"
    if settings:
        Queue.objects.filter(name__startswith="tasks_").update(**settings)


def _finished(result):
    def check():
        result.refresh()
        return result.is_finished

    return check


def _stop(proc: subprocess.Popen) -> tuple[str, str]:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out, err


def test_tasks_run_in_a_worker_process(spawn):
    with pytest.raises(UnroutedTask):
        jobs.add.enqueue(1, 2)
    _queues()
    added = jobs.add.enqueue(2, 3)
    greeted = jobs.greet.enqueue("ada", greeting="hi")
    proc = spawn("pgmb_tasks_worker")
    for result in (added, greeted):
        wait_until(_finished(result), message=lambda: f"task results ({proc.poll()=})")
    assert added.status == TaskResultStatus.SUCCESSFUL
    assert added.return_value == 5
    assert greeted.return_value == {"text": "hi, ada", "pid": proc.pid}
    assert added.worker_ids == [f"{socket.gethostname()[:50]}:{proc.pid}"]
    assert added.errors == [] and added.started_at <= added.finished_at
    out, _ = _stop(proc)
    assert "running tasks from tasks_default, tasks_emails" in out
    assert "2 tasks done, 0 attempts failed" in out


def test_a_failing_task_is_retried_until_it_succeeds(spawn):
    _queues(max_retries=5, backoff_base=0.0, backoff_max=0.0)
    result = jobs.flaky.enqueue(succeed_on=3)
    proc = spawn("pgmb_tasks_worker", "--queue-name", "default")
    wait_until(_finished(result), message="the flaky task")
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    assert result.attempts == 3
    assert [e.exception_class for e in result.errors] == [RuntimeError, RuntimeError]
    assert "attempt 2 fails" in result.errors[1].traceback
    out, _ = _stop(proc)
    assert "1 tasks done, 2 attempts failed" in out


def test_a_task_that_keeps_failing_is_dead_lettered_and_failed(spawn):
    _queues(max_retries=1, backoff_base=0.0, backoff_max=0.0)
    result = jobs.explode.enqueue("boom")
    proc = spawn("pgmb_tasks_worker", "--queue-name", "default")
    wait_until(_finished(result), message="the failing task")
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 2
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"] * 2
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    wait_until(
        lambda: DeadLetter.objects.filter(
            message_id=result.id, queue__name="tasks_default"
        ).exists(),
        message="the dead letter",
    )
    _stop(proc)


def _terminate(proc: subprocess.Popen) -> str:
    """SIGTERM, then the exit status 0 and stdout (stderr is read by a StderrLines)."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    return proc.stdout.read()


def test_the_worker_waits_for_the_database_at_the_start(spawn):
    """Started with its database (a container, a failover): it waits, then runs tasks."""
    _queues()
    added = jobs.add.enqueue(2, 3)
    with closed_to_connections():
        proc = spawn("pgmb_tasks_worker")
        stderr = StderrLines(proc)
        wait_until(lambda: stderr.has("cannot reach the database"), message="a refusal")
        assert proc.poll() is None
    wait_until(_finished(added), message="the task run once the database is back")
    assert added.return_value == 5
    assert stderr.has("reached the database")
    assert "1 tasks done, 0 attempts failed" in _terminate(proc)


def test_a_worker_waiting_for_the_database_stops_on_sigterm(spawn):
    _queues()
    with closed_to_connections():
        proc = spawn("pgmb_tasks_worker")
        stderr = StderrLines(proc)
        wait_until(lambda: stderr.has("cannot reach the database"), message="a refusal")
        out = _terminate(proc)
    assert "stopped before the database could be reached" in out
    assert not DispatcherProcess.objects.exists()


def test_pgmb_consume_runs_a_tasks_queue_with_the_handler(spawn):
    _queues()
    result = jobs.greet.enqueue("grace")
    proc = spawn("pgmb_consume", "tasks_emails", "--handler", "pgmb.tasks.worker.run_message")
    wait_until(_finished(result), message="the task")
    assert result.return_value == {"text": "hello, grace", "pid": proc.pid}
    _stop(proc)


def test_the_worker_refuses_what_it_cannot_run(db, make_queue):
    with pytest.raises(CommandError, match="no Tasks backend 'nope'"):
        call_command("pgmb_tasks_worker", "--backend", "nope")
    with pytest.raises(CommandError, match="'immediate' is a ImmediateBackend"):
        call_command("pgmb_tasks_worker", "--backend", "immediate")
    with pytest.raises(CommandError, match="no queue 'other'"):
        call_command("pgmb_tasks_worker", "--queue-name", "other")
    make_queue(binding_key="tasks.#", name="tasks_emails")
    with pytest.raises(CommandError, match="'tasks_emails' exists but is not the pull queue"):
        call_command("pgmb_tasks_worker", "--create-queues")
    assert not Queue.objects.filter(name="tasks_default").exists()  # none is created
    config = {"default": {"BACKEND": "pgmb.tasks.PgmbBackend", "QUEUES": []}}
    with override_settings(TASKS=config), pytest.raises(CommandError, match="'Bad'"):
        call_command("pgmb_tasks_worker", "--queue-name", "Bad")
    assert not Queue.objects.filter(name__startswith="tasks_").exclude(name="tasks_emails")
