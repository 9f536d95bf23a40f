"""Schedules in the admin: the list (state, when, next run, last runs), and the pause and
resume actions with the pgmb.pause_schedule permission (offered, logged) and without it
(not offered, a POST refused, nothing changed)."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection

from pgmb import schedules
from pgmb.models import Schedule

from .conftest import url

pytestmark = pytest.mark.django_db

ACTIONS = {"pause_schedules", "resume_schedules"}


@pytest.fixture
def two_schedules(db):
    schedules.schedule(
        "nightly", "report.nightly", {"k": 1}, cron="30 2 * * *", timezone="Europe/Berlin"
    )
    schedules.schedule("heartbeat", "ops.heartbeat", {}, every=10)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgmb_schedule SET next_run_at = now() - interval '1 s' WHERE name = 'heartbeat'"
        )
        cursor.execute("SELECT pgmb.fire_schedules()")
    return {s.name: s for s in Schedule.objects.all()}


def staff_client(client, django_user_model, *codenames):
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type=ContentType.objects.get_for_model(Schedule),
            codename__in=["view_schedule", *codenames],
        )
    )
    client.force_login(user)
    return client


def choices(client) -> set[str]:
    response = client.get(url("schedule_changelist"))
    assert response.status_code == 200
    form = response.context["action_form"]
    return {name for name, _label in form.fields["action"].choices} if form else set()


def post(client, action, selected):
    return client.post(
        url("schedule_changelist"),
        {"action": action, "index": "0", "_selected_action": [str(s.pk) for s in selected]},
    )


def test_the_list_shows_when_next_and_last_runs(admin_client, two_schedules):
    page = admin_client.get(url("schedule_changelist")).content.decode()
    assert "30 2 * * * (Europe/Berlin)" in page
    assert "every 10 s" in page
    fired = two_schedules["heartbeat"].last_runs[0]
    from django.utils import timezone

    assert timezone.localtime(fired).strftime("%Y-%m-%d %H:%M:%S") in page
    assert "pgmb-state-running" in page


def test_with_the_permission_pause_and_resume_are_logged(client, django_user_model, two_schedules):
    operator = staff_client(client, django_user_model, "pause_schedule")
    assert choices(operator) >= ACTIONS
    response = post(operator, "pause_schedules", list(two_schedules.values()))
    assert response.status_code == 302
    assert set(Schedule.objects.filter(paused=True).values_list("name", flat=True)) == {
        "nightly",
        "heartbeat",
    }
    post(operator, "resume_schedules", [two_schedules["nightly"]])
    assert list(Schedule.objects.filter(paused=True).values_list("name", flat=True)) == [
        "heartbeat"
    ]
    assert sorted((e.object_repr, e.action_flag) for e in LogEntry.objects.all()) == [
        ("heartbeat", CHANGE),
        ("nightly", CHANGE),
        ("nightly", CHANGE),
    ]


def test_without_the_permission_nothing_is_offered_nor_done(
    client, django_user_model, two_schedules
):
    viewer = staff_client(client, django_user_model)
    assert not (choices(viewer) & ACTIONS)
    response = post(viewer, "pause_schedules", list(two_schedules.values()))
    assert response.status_code == 403
    assert not Schedule.objects.filter(paused=True).exists()
    assert not LogEntry.objects.exists()
