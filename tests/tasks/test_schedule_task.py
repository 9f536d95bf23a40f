"""A Django task scheduled (pgmb.tasks.schedule_task): each fire of its schedule enqueues
the task as the backend would (its message and its READY result row), so the worker runs
it; without a queue bound to the task's key the fire records why and moves on."""

from __future__ import annotations

import datetime

import pytest
from django.db import connection
from django_tasks import TaskResultStatus

from pgmb import schedules
from pgmb.errors import InvalidSchedule
from pgmb.models import Schedule
from pgmb.models import TaskResult as TaskResultRow
from pgmb.tasks import schedule_task
from pgmb.tasks.executor import run_task
from tests.tasks import jobs

pytestmark = pytest.mark.django_db


def _fire_now(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgmb_schedule SET next_run_at = now() - interval '1 second' WHERE name = %s",
            [name],
        )
        cursor.execute("SELECT pgmb.fire_schedules()")
        return cursor.fetchone()[0]


def test_a_scheduled_task_runs_with_its_arguments(make_queue):
    make_queue(binding_key="tasks.emails", name="tasks_emails", max_retries=0)
    sid = schedule_task(
        jobs.greet,
        cron="0 8 * * MON-FRI",
        timezone="Europe/Berlin",
        args=["ada"],
        kwargs={"greeting": "morning"},
    )
    s = Schedule.objects.get(id=sid)
    assert (s.name, s.routing_key) == ("tests.tasks.jobs.greet", "tasks.emails")
    assert _fire_now(s.name) == 1
    due = Schedule.objects.get(id=sid).last_runs[0]
    row = TaskResultRow.objects.get()
    assert row.id == schedules.message_id(sid, due)
    assert (row.task_path, row.status, row.args, row.kwargs) == (
        "tests.tasks.jobs.greet",
        "READY",
        ["ada"],
        {"greeting": "morning"},
    )
    ran = run_task(str(row.id), attempt=1, max_attempts=1)
    assert ran is not None and ran.status == TaskResultStatus.SUCCESSFUL
    assert ran.return_value["text"] == "morning, ada"


def test_without_a_queue_the_fire_records_why(db):
    sid = schedule_task(jobs.add, every=datetime.timedelta(minutes=5), args=[1, 2])
    assert _fire_now("tests.tasks.jobs.add") == 0
    s = Schedule.objects.get(id=sid)
    assert "no queue is bound to tasks.default" in s.last_error
    assert not TaskResultRow.objects.exists()
    assert s.next_run_at > datetime.datetime.now(datetime.timezone.utc)


def test_bad_arguments_store_nothing(db):
    with pytest.raises(InvalidSchedule, match="JSON"):
        schedule_task(jobs.add, every=60, args=[object()])
    with pytest.raises(InvalidSchedule, match="bad minute"):
        schedule_task(jobs.add, cron="61 * * * *")
    assert not Schedule.objects.exists()
