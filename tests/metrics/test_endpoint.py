"""/metrics: who may read it, and what it serves."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

TOKEN = "s3cret-token-0123456789"
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


@pytest.fixture
def token(settings):
    settings.PGMB = {"METRICS_TOKEN": TOKEN}


def test_anonymous_gets_401(client, world):
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_non_staff_user_gets_403(client, world):
    client.force_login(User.objects.create_user("someone"))
    assert client.get("/metrics").status_code == 403


def staff_user(*codenames: str) -> User:
    user = User.objects.create_user("operator", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="pgmb", codename__in=codenames)
    )
    assert user.user_permissions.count() == len(codenames)
    return user


@pytest.mark.parametrize("codenames", [(), ("view_worker", "view_queue")])
def test_staff_without_the_permission_get_403(client, world, codenames):
    client.force_login(staff_user(*codenames))

    response = client.get("/metrics")

    assert response.status_code == 403
    assert b"pgmb_queue_length" not in response.content


def test_a_non_staff_user_with_the_permission_gets_403(client, world):
    user = staff_user("view_dashboard")
    user.is_staff = False
    user.save()
    client.force_login(user)
    assert client.get("/metrics").status_code == 403


def test_staff_user_reads_the_metrics(client, world):
    client.force_login(staff_user("view_dashboard"))
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"] == PROMETHEUS
    body = response.content.decode()
    assert 'pgmb_queue_length{queue="busy_queue"} 8\n' in body
    assert 'pgmb_worker_requests_last_hour{worker="metrics_worker"} 7\n' in body
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]


def test_right_bearer_token(client, world, token):
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    assert response["Content-Type"] == PROMETHEUS
    assert 'pgmb_queue_dead_letters{queue="busy_queue"} 2\n' in response.content.decode()


@pytest.mark.parametrize(
    "header",
    [f"Bearer {TOKEN}x", "Bearer wrong", "Bearer ", f"Bearer {TOKEN[:-1]}"],
)
def test_wrong_bearer_token_gets_401(client, world, token, header):
    assert client.get("/metrics", headers={"Authorization": header}).status_code == 401


def test_missing_bearer_token_gets_401(client, world, token):
    assert client.get("/metrics").status_code == 401
    # Another scheme is no token at all.
    assert client.get("/metrics", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401


def test_bearer_disabled_by_default(client, world):
    assert client.get("/metrics", headers={"Authorization": "Bearer "}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer x" * 3}).status_code == 401


def test_a_wrong_token_is_refused_even_for_staff(client, world, token):
    client.force_login(staff_user("view_dashboard"))
    assert client.get("/metrics").status_code == 200
    assert client.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_only_get_and_head(client, world, token):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.head("/metrics", headers=auth).status_code == 200
    assert client.post("/metrics", headers=auth).status_code == 405


@pytest.mark.parametrize(
    ("token_value", "ok"),
    [("", True), (TOKEN, True), ("short", False), ("has a blank in it ok", False)],
)
def test_the_setting_is_validated(token_value, ok):
    from pgmb import conf

    problems = conf.errors({"METRICS_TOKEN": token_value})
    assert (problems == []) is ok, problems
    assert ok or "METRICS_TOKEN" in problems[0]
    assert conf.errors({"METRICS_TOKEN": 123}) == ["PGMB['METRICS_TOKEN'] must be str, got 123"]
