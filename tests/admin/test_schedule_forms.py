"""Adding, changing and deleting schedules in the admin: written through pgmb.schedule (the
next due time is the write path's), bad input refused with a form error and nothing stored,
each page and POST granted by add/change/delete_schedule (a user without them gets 403 and
nothing changes), LogEntry rows for what was done; the change page shows the next run and
the last runs with their messages (docs/decisions/0092-schedules-edited-in-the-admin.md)."""

from __future__ import annotations

import datetime

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.utils import timezone

from pgmb import schedules
from pgmb.models import Message, Schedule

from .conftest import form_errors, url

pytestmark = pytest.mark.django_db

FORM = {
    "name": "nightly",
    "cron": "30 2 * * *",
    "every": "",
    "timezone": "Europe/Berlin",
    "missed": "skip",
    "routing_key": "report.nightly",
    "body": '{"kind": "daily"}',
    "headers": '{"x-team": "ops"}',
}


def staff(client, django_user_model, *codenames, username="operator"):
    user = django_user_model.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type=ContentType.objects.get_for_model(Schedule), codename__in=codenames
        )
    )
    assert user.user_permissions.count() == len(codenames)
    client.force_login(user)
    return client


def stored(name: str) -> dict:
    return Schedule.objects.filter(name=name).values(
        "cron", "every", "timezone", "missed", "routing_key", "body", "headers", "paused"
    )[0]


def test_adding_writes_through_pgmb_schedule(admin_client):
    response = admin_client.post(url("schedule_add"), FORM)
    assert form_errors(response) == {}
    schedule = Schedule.objects.get()
    assert stored("nightly") == {
        "cron": "30 2 * * *",
        "every": None,
        "timezone": "Europe/Berlin",
        "missed": "skip",
        "routing_key": "report.nightly",
        "body": {"kind": "daily"},
        "headers": {"x-team": "ops"},
        "paused": False,
    }
    # The next due time is the cron rule's from the moment it was written.
    assert schedule.next_run_at == schedules.cron_next(
        "30 2 * * *", "Europe/Berlin", schedule.created_at
    )
    entry = LogEntry.objects.get()
    assert (entry.object_repr, entry.action_flag) == ("nightly", ADDITION)


def test_adding_an_interval_schedule_paused(admin_client):
    form = {**FORM, "name": "beat", "cron": "", "every": "10", "headers": "", "paused": "on"}
    assert form_errors(admin_client.post(url("schedule_add"), form)) == {}
    schedule = Schedule.objects.get()
    assert schedule.every == datetime.timedelta(seconds=10)
    assert schedule.headers == {}
    assert schedule.paused
    assert schedule.next_run_at == schedule.created_at + datetime.timedelta(seconds=10)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"cron": "61 * * * *"}, "cron", 'bad cron expression "61 * * * *"'),
        ({"cron": "0 0 * * * *"}, "cron", "expected 5 fields"),
        ({"cron": "0 0 L * *"}, "cron", "L, W and # are not supported"),
        ({"timezone": "Mars/Olympus"}, "timezone", 'unknown time zone "Mars/Olympus"'),
        ({"every": "10"}, "every", "give either cron or every, not both or neither"),
        ({"cron": ""}, "every", "give either cron or every, not both or neither"),
        ({"cron": "", "every": "0.5"}, "__all__", "an interval of at least 1 second"),
        ({"body": '{"kind": '}, "body", "Enter a valid JSON."),
        ({"body": "null"}, "body", "This field is required."),
        ({"headers": "[1, 2]"}, "__all__", "the headers are a JSON object, not array"),
        ({"headers": '{"Authorization": "x"}'}, "__all__", "Authorization"),
        ({"routing_key": "report.*"}, "routing_key", "wildcards"),
        ({"name": ""}, "name", "This field is required."),
    ],
)
def test_bad_input_is_a_form_error_and_nothing_is_stored(admin_client, change, field, words):
    response = admin_client.post(url("schedule_add"), {**FORM, **change})
    errors = form_errors(response)
    assert field in errors, errors
    assert any(words in message for message in errors[field]), errors
    assert not Schedule.objects.exists()
    assert not LogEntry.objects.exists()


def test_adding_an_existing_name_changes_nothing(admin_client):
    schedules.schedule("nightly", "report.old", {"v": 1}, every=60)
    before = stored("nightly")
    errors = form_errors(admin_client.post(url("schedule_add"), FORM))
    assert errors == {"name": ["Schedule with this Name already exists."]}
    assert stored("nightly") == before


def test_changing_keeps_or_recomputes_the_next_due_time(admin_client):
    pk = schedules.schedule("nightly", "report.nightly", {"v": 1}, cron="30 2 * * *")
    first = Schedule.objects.get(pk=pk).next_run_at
    change = {
        **FORM,
        **{"name": "renamed", "timezone": "UTC", "body": '{"v": 2}', "missed": "once"},
        "headers": "{}",
        "initial-headers": "{}",  # the hidden initial of a field with a callable default
    }
    assert form_errors(admin_client.post(url("schedule_change", pk), change)) == {}
    schedule = Schedule.objects.get()
    # The name is the schedule's identity: read-only once added.
    assert (schedule.name, schedule.body, schedule.missed) == ("nightly", {"v": 2}, "once")
    assert schedule.next_run_at == first  # cron, interval and time zone unchanged

    change = {**change, "cron": "", "every": "00:05:00"}
    assert form_errors(admin_client.post(url("schedule_change", pk), change)) == {}
    schedule.refresh_from_db()
    assert (schedule.cron, schedule.every) == (None, datetime.timedelta(minutes=5))
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (now,) = cursor.fetchone()
    assert schedule.next_run_at == now + datetime.timedelta(minutes=5)
    assert [(e.action_flag, e.get_change_message()) for e in LogEntry.objects.order_by("pk")] == [
        (CHANGE, "Changed Body."),
        (CHANGE, "Changed Cron and Every."),
    ]


def test_a_bad_change_stores_nothing(admin_client):
    pk = schedules.schedule("nightly", "report.nightly", {"v": 1}, cron="30 2 * * *")
    before = stored("nightly")
    response = admin_client.post(url("schedule_change", pk), {**FORM, "cron": "0 25 * * *"})
    assert "cron" in form_errors(response)
    assert stored("nightly") == before
    assert not LogEntry.objects.exists()


def test_a_task_schedule_stays_one(admin_client):
    task = {"backend": "default", "task_path": "app.tasks.digest", "queue_name": "default"}
    pk = schedules.schedule("digest", "tasks.default", {"args": []}, every=60, task=task)
    form = {**FORM, "name": "digest", "cron": "", "every": "120", "routing_key": "tasks.default"}
    assert form_errors(admin_client.post(url("schedule_change", pk), form)) == {}
    schedule = Schedule.objects.get()
    assert (schedule.task, schedule.every) == (task, datetime.timedelta(seconds=120))


def test_the_change_page_shows_the_next_run_and_the_last_runs(admin_client):
    pk = schedules.schedule("beat", "ops.beat", {}, every=10)
    with connection.cursor() as cursor:
        for ago in ("2 s", "1 s"):  # two due times, two messages
            cursor.execute(
                "UPDATE pgmb_schedule SET next_run_at = now() - %s::interval WHERE name = 'beat'",
                [ago],
            )
            cursor.execute("SELECT pgmb.fire_schedules()")
    schedule = Schedule.objects.get()
    assert len(schedule.last_runs) == 2
    # The older run's message is gone (retention, say): its time stays, without a link.
    Message.objects.filter(pk=schedules.message_id(pk, schedule.last_runs[1])).delete()
    page = admin_client.get(url("schedule_change", pk)).content.decode()
    assert timezone.localtime(schedule.next_run_at).strftime("%Y-%m-%d %H:%M:%S") in page
    newest, older = (
        timezone.localtime(d).strftime("%Y-%m-%d %H:%M:%S") for d in schedule.last_runs
    )
    message = url("message_change", schedules.message_id(pk, schedule.last_runs[0]))
    assert f'{newest} <a href="{message}">message</a>' in page
    assert f"{older} (message removed)" in page


def test_deleting_goes_through_unschedule_and_is_logged(admin_client):
    pk = schedules.schedule("nightly", "report.nightly", {}, cron="30 2 * * *")
    schedules.schedule("beat", "ops.beat", {}, every=10)
    response = admin_client.post(url("schedule_delete", pk), {"post": "yes"})
    assert response.status_code == 302
    assert list(Schedule.objects.values_list("name", flat=True)) == ["beat"]
    response = admin_client.post(
        url("schedule_changelist"),
        {
            "action": "delete_selected",
            "post": "yes",
            "_selected_action": [str(Schedule.objects.get().pk)],
        },
    )
    assert response.status_code == 302
    assert not Schedule.objects.exists()
    assert sorted((e.object_repr, e.action_flag) for e in LogEntry.objects.all()) == [
        ("beat", DELETION),
        ("nightly", DELETION),
    ]


def test_a_viewer_sees_the_pages_but_may_change_nothing(client, django_user_model):
    pk = schedules.schedule("nightly", "report.nightly", {"v": 1}, cron="30 2 * * *")
    before = stored("nightly")
    viewer = staff(client, django_user_model, "view_schedule")
    page = viewer.get(url("schedule_change", pk))
    assert page.status_code == 200
    assert 'name="cron"' not in page.content.decode()
    assert viewer.get(url("schedule_add")).status_code == 403
    assert viewer.post(url("schedule_add"), {**FORM, "name": "other"}).status_code == 403
    assert viewer.post(url("schedule_change", pk), {**FORM, "cron": "0 1 * * *"}).status_code == 403
    assert viewer.get(url("schedule_delete", pk)).status_code == 403
    assert viewer.post(url("schedule_delete", pk), {"post": "yes"}).status_code == 403
    response = viewer.post(
        url("schedule_changelist"),
        {"action": "delete_selected", "post": "yes", "_selected_action": [str(pk)]},
    )
    assert response.status_code == 403
    assert list(Schedule.objects.values_list("name", flat=True)) == ["nightly"]
    assert stored("nightly") == before
    assert not LogEntry.objects.exists()


def test_each_permission_grants_its_own_page(client, django_user_model):
    pk = schedules.schedule("nightly", "report.nightly", {"v": 1}, cron="30 2 * * *")
    adder = staff(client, django_user_model, "view_schedule", "add_schedule")
    assert adder.post(url("schedule_add"), {**FORM, "name": "other"}).status_code == 302
    assert adder.post(url("schedule_change", pk), {**FORM, "cron": "0 1 * * *"}).status_code == 403
    assert adder.post(url("schedule_delete", pk), {"post": "yes"}).status_code == 403
    assert stored("nightly")["cron"] == "30 2 * * *"
    assert sorted(Schedule.objects.values_list("name", flat=True)) == ["nightly", "other"]


def test_pausing_in_the_form_needs_the_pause_permission(client, django_user_model):
    pk = schedules.schedule("nightly", "report.nightly", {"v": 1}, cron="30 2 * * *")
    changer = staff(client, django_user_model, "view_schedule", "change_schedule")
    page = changer.get(url("schedule_change", pk)).content.decode()
    assert 'name="paused"' not in page
    response = changer.post(url("schedule_change", pk), {**FORM, "paused": "on", "body": "{}"})
    assert form_errors(response) == {}
    assert stored("nightly")["paused"] is False
    assert stored("nightly")["body"] == {}

    client.logout()
    pauser = staff(
        client,
        django_user_model,
        "view_schedule",
        "change_schedule",
        "pause_schedule",
        username="pauser",
    )
    response = pauser.post(url("schedule_change", pk), {**FORM, "paused": "on"})
    assert form_errors(response) == {}
    assert stored("nightly")["paused"] is True
    response = pauser.post(url("schedule_change", pk), FORM)
    assert form_errors(response) == {}
    assert stored("nightly")["paused"] is False
    # The changer's change, then the pause and the resume.
    messages = [e.get_change_message() for e in LogEntry.objects.order_by("pk")]
    assert len(messages) == 3 and "Paused" not in messages[0]
    assert all(m.startswith("Changed Paused") for m in messages[1:]), messages


def fire(ago: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgmb_schedule SET next_run_at = now() - %s::interval WHERE name = 'beat'",
            [ago],
        )
        cursor.execute("SELECT pgmb.fire_schedules()")


def test_the_last_runs_cost_one_query_however_many(admin_client, count_queries):
    pk = schedules.schedule("beat", "ops.beat", {}, every=10)
    page = url("schedule_change", pk)
    fire("10 s")
    one = count_queries(lambda: admin_client.get(page))
    for n in range(9, 0, -1):
        fire(f"{n} s")
    assert len(Schedule.objects.get().last_runs) == 10
    assert count_queries(lambda: admin_client.get(page)) == one
