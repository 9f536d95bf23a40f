"""Pull queues in the admin: created without a worker, listed and filtered with the
others, at the same number of queries."""

from __future__ import annotations

from django.urls import reverse

import pgmb
from pgmb import pull
from pgmb.models import Queue
from tests.admin.conftest import form_errors, table_rows, url
from tests.admin.test_queues import cells, queue_data


def test_the_add_form_accepts_no_worker(admin_client, make_worker):
    response = admin_client.post(url("queue_add"), queue_data(make_worker(), worker=""))
    assert form_errors(response) == {}
    queue = Queue.objects.get(name="order_queue")
    assert queue.worker is None
    pgmb.send("order.created", {"n": 1})
    assert [m.body for m in pull.read(queue.name, 30, 1)] == [{"n": 1}]


def test_changelist_shows_pull_and_push_queues_in_as_many_queries(
    admin_client, make_queue, make_pull_queue, count_queries, django_assert_max_num_queries
):
    make_queue("order.*", name="push_one")
    admin_client.get(url("queue_changelist"))  # warm up: the session, caches
    few = count_queries(lambda: admin_client.get(url("queue_changelist")))
    for n in range(3):
        make_pull_queue("order.*", name=f"pull_{n}")
    pgmb.send("order.created", {})
    with django_assert_max_num_queries(few):
        response = admin_client.get(url("queue_changelist"))
    rows = {cells(row)["name"]: cells(row) for row in table_rows(response)}
    assert set(rows) == {"push_one", "pull_0", "pull_1", "pull_2"}
    assert rows["pull_0"]["state"] == "running"
    # The state filter's "running" includes pull queues.
    running = admin_client.get(url("queue_changelist") + "?state=running")
    assert {cells(row)["name"] for row in table_rows(running)} == set(rows)
    change = admin_client.get(url("queue_change", Queue.objects.get(name="pull_0").pk))
    assert change.status_code == 200
    assert '<div class="readonly">1</div>' in change.content.decode()  # its pending message


def test_dashboard_and_dispatchers_show_pull_queues_and_consumers(
    admin_client, make_pull_queue, sql
):
    queue = make_pull_queue()
    pgmb.send("k", {"n": 1})
    [message] = pull.read(queue.name, 30, 1)
    pull.delete(queue.name, [message])
    sql("SELECT pgmb.dispatcher_start('consumer', 'host-a', 4242, %s)", [[queue.name]])
    dashboard = admin_client.get(reverse("admin:pgmb_dashboard"))
    assert dashboard.status_code == 200
    assert queue.name in dashboard.content.decode()
    listed = admin_client.get(url("dispatcherprocess_changelist"))
    assert "pull consumer (pgmb_consume)" in listed.content.decode()
    assert "host-a" in listed.content.decode()
