"""Circuit breakers in the admin: the worker list's badge and reason, the settings in the
change form, the action that closes breakers (its permission, message and log entries),
and the pinned query count of the list whatever the states."""

import re

import pytest
from django.contrib import messages as message_levels
from django.contrib.admin.models import CHANGE
from django.urls import reverse

import pgmb
from pgmb import deliveries, metrics
from pgmb.deliveries import Failure
from pgmb.models import Worker

from .conftest import form_errors, table_rows, url
from .test_pause import action_choices, logged, post_action, reported, staff_client


def _open(worker, n=2):
    """Open the breaker of a worker whose breaker_failures is n, as its endpoint would."""
    for i in range(n):
        pgmb.send(f"{worker.name}.k", i)
    rows = deliveries.claim([q.name for q in worker.queues.all()], limit=n)
    deliveries.fail([Failure(r.delivery_id, r.lease_id, 503, "HTTP 503: busy") for r in rows])
    assert Worker.objects.get(pk=worker.pk).breaker_state == "open"


@pytest.fixture
def workers(make_worker, make_queue):
    """plain (no breaker), calm (closed) and tripped (open)."""
    found = {
        "plain": make_worker("plain"),
        "calm": make_worker("calm", breaker_failures=2),
        "tripped": make_worker("tripped", breaker_failures=2, breaker_cooldown=60),
    }
    for name, worker in found.items():
        make_queue(f"{name}.#", name=f"{name}_q", worker=worker)
    _open(found["tripped"])
    return found


def breaker_cells(response) -> dict[str, tuple[str, str]]:
    """{name: (badge text, badge title)} of the worker list."""
    found = {}
    for row in table_rows(response):
        name = re.search(r'class="field-name[^"]*"[^>]*>(?:<a[^>]*>)?([^<]+)<', row).group(1)
        badge = re.search(
            r'<td class="field-breaker"><span[^>]*title="([^"]*)"[^>]*>([^<]*)</span>', row
        )
        found[name] = (badge.group(2), badge.group(1))
    return found


def test_the_worker_list_shows_each_breaker_and_why(admin_client, workers):
    cells = breaker_cells(admin_client.get(url("worker_changelist")))
    assert cells["plain"][0] == "off"
    assert cells["calm"] == ("closed", "")
    text, title = cells["tripped"]
    assert text == "open"
    assert title.startswith("2 failures in a row (last: HTTP 503: busy); next probe in ")


def test_the_change_form_saves_the_settings_and_refuses_bad_ones(admin_client, workers):
    worker = workers["plain"]
    data = {
        "name": "plain",
        "endpoint": worker.endpoint,
        "rps": "10",
        "burst": "0.2",
        "timeout": "10",
        "active": "on",
        "breaker_failures": "5",
        "breaker_rate": "0.5",
        "breaker_window": "30",
        "breaker_min_requests": "10",
        "breaker_cooldown": "20",
        "breaker_cooldown_max": "10",
        "_save": "Save",
    }
    response = admin_client.post(url("worker_change", worker.pk), data)
    assert form_errors(response) == {
        "breaker_cooldown_max": ["The cap must be at least the cool-down."]
    }
    page = admin_client.get(url("worker_change", worker.pk)).content.decode()
    assert "Circuit breaker" in page and 'name="breaker_state"' not in page
    response = admin_client.post(
        url("worker_change", worker.pk), {**data, "breaker_cooldown_max": "40"}
    )
    assert response.status_code == 302
    saved = Worker.objects.get(pk=worker.pk)
    assert (saved.breaker_failures, saved.breaker_rate, saved.breaker_window) == (5, 0.5, 30)
    assert (saved.breaker_min_requests, saved.breaker_cooldown, saved.breaker_cooldown_max) == (
        10,
        20,
        40,
    )


def test_closing_breakers_by_hand(admin_client, workers):
    assert "close_breakers" in action_choices(admin_client, "worker")
    response = post_action(
        admin_client, "worker", "close_breakers", [workers["tripped"], workers["calm"]]
    )
    assert reported(admin_client, response) == [
        (message_levels.SUCCESS, "Closed the circuit breaker of 1 worker; 1 was not open.")
    ]
    tripped = Worker.objects.get(pk=workers["tripped"].pk)
    assert (tripped.breaker_state, tripped.breaker_reason) == ("closed", "closed by hand")
    assert logged() == [
        ("worker", "tripped", CHANGE, "Closed the circuit breaker from the list's action.")
    ]
    pgmb.send("tripped.k", 3)
    assert [r.queue for r in deliveries.claim(["tripped_q"])] == ["tripped_q"]


def test_closing_only_closed_breakers_changes_nothing_and_warns(admin_client, workers):
    response = post_action(admin_client, "worker", "close_breakers", [workers["calm"]])
    assert reported(admin_client, response) == [
        (message_levels.WARNING, "Closed the circuit breakers of 0 workers; 1 was not open.")
    ]
    assert logged() == []


def test_staff_without_the_pause_worker_permission_cannot_close_them(
    client, django_user_model, workers
):
    staff = staff_client(client, django_user_model)
    assert "close_breakers" not in action_choices(staff, "worker")
    assert post_action(staff, "worker", "close_breakers", [workers["tripped"]]).status_code == 403
    assert Worker.objects.get(pk=workers["tripped"].pk).breaker_state == "open"


def test_the_pause_worker_permission_grants_closing_them(client, django_user_model, workers):
    staff = staff_client(client, django_user_model, "pause_worker")
    assert "close_breakers" in action_choices(staff, "worker")
    response = post_action(staff, "worker", "close_breakers", [workers["tripped"]])
    assert reported(staff, response) == [
        (message_levels.SUCCESS, "Closed the circuit breaker of 1 worker.")
    ]
    assert Worker.objects.get(pk=workers["tripped"].pk).breaker_state == "closed"


def test_the_list_costs_the_same_queries_whatever_the_breakers(
    admin_client, make_worker, make_queue, count_queries, django_assert_num_queries
):
    for i in range(3):
        make_queue(f"w{i}.#", worker=make_worker(f"w{i}"))
    admin_client.get(url("worker_changelist"))  # warm up: the session, caches
    few = count_queries(lambda: admin_client.get(url("worker_changelist")))
    for i in range(3, 9):
        worker = make_worker(f"w{i}", breaker_failures=2)
        make_queue(f"w{i}.#", worker=worker)
        if i % 2:
            _open(worker)
    with django_assert_num_queries(few):
        admin_client.get(url("worker_changelist"))


def test_the_dashboard_shows_each_breaker_and_why(admin_client, workers):
    html = admin_client.get(reverse("admin:pgmb_dashboard")).content.decode()
    table = html.split('id="pgmb-workers"', 1)[1].split("</table>", 1)[0]
    rows = {
        name: cell
        for name, cell in re.findall(
            r'data-worker="([^"]+)">.*?<td class="field-breaker">(.*?)</td>', table, re.S
        )
    }
    assert ">off<" in rows["plain"] and ">closed<" in rows["calm"]
    assert ">open<" in rows["tripped"]
    assert 'title="2 failures in a row (last: HTTP 503: busy); next probe in ' in rows["tripped"]


def test_the_metrics_carry_each_breaker(workers):
    by_name = {w.worker_name: w for w in metrics.workers()}
    assert (by_name["plain"].breaker_state, by_name["plain"].breaker_reason) == ("off", "")
    assert by_name["calm"].breaker_state == "closed"
    tripped = by_name["tripped"]
    assert (tripped.breaker_state, tripped.breaker_reason) == (
        "open",
        "2 failures in a row (last: HTTP 503: busy)",
    )
    assert tripped.breaker_since < tripped.breaker_until
    text = metrics.render(metrics.Snapshot((), tuple(by_name.values())))
    assert 'pgmb_worker_breaker_state{worker="tripped"} 1\n' in text
    assert 'pgmb_worker_breaker_state{worker="calm"} 0\n' in text
    assert 'pgmb_worker_breaker_state{worker="plain"}' not in text
