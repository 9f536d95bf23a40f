"""The operator's dashboard: who may see it, where it is linked, and its figures checked
against known data (attempts, deliveries and messages placed in known minutes) and against
pgmb.metrics, the lists' own source; its query count and its statement's plan."""

from __future__ import annotations

import datetime
import json
import re
from xml.etree import ElementTree as ET

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import override_settings
from django.urls import reverse

import pgmb
from pgmb import dashboard_series, deliveries, dispatcher_registry, metrics
from pgmb import sql as pgmb_sql
from pgmb.admin.charts import SVG_NS
from pgmb.models import Queue
from tests.metrics.conftest import world  # noqa: F401

DASHBOARD = "/admin/pgmb/dashboard/"


def minute(sql, minutes_ago: int):
    """The start of the minute ``minutes_ago`` before the one holding now()."""
    ((at,),) = sql("SELECT date_trunc('minute', now()) - %s * interval '1 minute'", (minutes_ago,))
    return at


def add_attempt(sql, queue, outcome, minutes_ago, *, second=15, attempt=1, message=None,
                duration=None):  # fmt: skip
    """An attempt ``second`` seconds into the minute ``minutes_ago`` before now()'s."""
    sql(
        "INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code,"
        " duration_ms, error, created_at)"
        " VALUES (coalesce(%s::uuid, gen_random_uuid()), %s, %s, %s, 200, %s, '',"
        " date_trunc('minute', now()) - %s * interval '1 minute' + %s * interval '1 second')",
        (message, queue.pk, attempt, outcome, duration, minutes_ago, second),
    )


def add_message(sql, routing_key, minutes_ago, *, second=10) -> str:
    ((message_id,),) = sql(
        "INSERT INTO pgmb_message (routing_key, body, created_at, available_at)"
        " VALUES (%s, '{}', date_trunc('minute', now()) - %s * interval '1 minute'"
        " + %s * interval '1 second', now()) RETURNING id",
        (routing_key, minutes_ago, second),
    )
    return str(message_id)


def add_delivery(sql, queue, minutes_ago, *, state="ready"):
    sql(
        "INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at,"
        " created_at, lease_id, last_error)"
        " VALUES (gen_random_uuid(), %s, %s, 0, now(),"
        " date_trunc('minute', now()) - %s * interval '1 minute' + interval '5 seconds',"
        " CASE WHEN %s = 'leased' THEN gen_random_uuid() END, '')",
        (queue.pk, state, minutes_ago, state),
    )


def by_minute(points) -> dict:
    return {p.at: p for p in points}


def svgs(response) -> list[ET.Element]:
    html = response.content.decode()
    found = re.findall(r"<svg [^>]*class=\"pgmb-chart\".*?</svg>", html, re.S)
    return [ET.fromstring(s) for s in found]


def table(response, table_id: str) -> dict[str, dict[str, str]]:
    """{first cell: {column: text}} of one of the page's tables (tbody rows)."""
    html = response.content.decode()
    body = html.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]
    body = body.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    rows = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S):
        found = re.findall(r'<td class="(?:num )?field-(\w+)"[^>]*>(.*?)</td>', row, re.S)
        cells = {name: re.sub(r"<[^>]+>", "", text).strip() for name, text in found}
        if cells:
            rows[next(iter(cells.values()))] = cells
    return rows


# Who sees it, and where it is linked.


def test_the_url_is_the_admin_sites_own():
    assert reverse("admin:pgmb_dashboard") == DASHBOARD


def test_staff_see_the_dashboard(admin_client):
    response = admin_client.get(reverse("admin:pgmb_dashboard"))

    assert response.status_code == 200
    html = response.content.decode()
    for table_id in ("pgmb-queues", "pgmb-workers", "pgmb-dispatchers"):
        assert f'<table id="{table_id}"' in html
    assert len(re.findall(r'<svg [^>]*class="pgmb-chart"', html)) == 4
    assert "<script" not in html.split('id="content-main"', 1)[1]


def staff_user(*codenames: str) -> User:
    user = User.objects.create_user("operator", password="x", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="pgmb", codename__in=codenames)
    )
    assert user.user_permissions.count() == len(codenames)
    return user


def test_staff_with_the_permission_see_it(client, db):
    client.force_login(staff_user("view_dashboard"))
    response = client.get(DASHBOARD)
    assert response.status_code == 200
    assert '<table id="pgmb-workers"' in response.content.decode()


@pytest.mark.parametrize("codenames", [(), ("view_worker", "view_queue", "view_message")])
def test_staff_without_the_permission_get_403(client, db, codenames):
    client.force_login(staff_user(*codenames))

    response = client.get(DASHBOARD, {"range": "1h"})

    assert response.status_code == 403
    assert 'id="pgmb-workers"' not in response.content.decode()
    # Nor is it offered on the index.
    assert DASHBOARD not in client.get("/admin/").content.decode()


@pytest.mark.parametrize("who", ["anonymous", "not staff"])
def test_others_are_sent_to_the_login_page(client, db, who):
    if who == "not staff":
        client.force_login(User.objects.create_user("customer", password="x"))

    response = client.get(DASHBOARD)

    assert response.status_code == 302
    assert response["Location"] == f"/admin/login/?next={DASHBOARD}"


@pytest.mark.parametrize("page", ["/admin/", "/admin/pgmb/"])
def test_the_index_links_to_it(admin_client, page):
    html = admin_client.get(page).content.decode()
    assert re.search(rf'<a href="{DASHBOARD}"[^>]*>Dashboard</a>', html), html


def test_it_has_nothing_to_add_change_or_delete(admin_client):
    html = admin_client.get("/admin/pgmb/").content.decode()
    assert "/admin/pgmb/dashboard/add/" not in html
    with pytest.raises(Exception, match="Reverse"):
        reverse("admin:pgmb_dashboard_add")


# Refreshing, and when it was rendered.


def test_it_reloads_itself_and_says_when_it_was_rendered(admin_client):
    html = admin_client.get(DASHBOARD).content.decode()
    assert '<meta http-equiv="refresh" content="30">' in html
    assert "reloads itself every 30 seconds" in html
    assert re.search(r'Rendered at <time datetime="\d{4}-\d\d-\d\dT[^"]+">', html)


def test_a_refresh_of_zero_turns_reloading_off(admin_client):
    with override_settings(PGMB={"DASHBOARD_REFRESH": 0}):
        html = admin_client.get(DASHBOARD).content.decode()
    assert 'http-equiv="refresh"' not in html
    assert "does not reload itself" in html


# The series, against known data.


@pytest.fixture
def known(sql, make_worker, make_queue):
    """Three acks and two failures (one of them dead-lettered) in the minute 10 minutes
    before now()'s on one queue, one ack 30 minutes back on a queue of another worker, and
    one ack before the hour."""
    worker = make_worker("known_worker")
    other_worker = make_worker("other_worker")
    queue = make_queue("known.#", name="known_queue", worker=worker)
    other = make_queue("other.#", name="other_queue", worker=other_worker)
    for second, duration in ((1, 10), (12, 20), (33, 30)):
        add_attempt(sql, queue, "ack", 10, second=second, duration=duration)
    add_attempt(sql, queue, "retry", 10, second=40, duration=40)
    add_attempt(sql, queue, "dead", 10, second=59, duration=50)
    add_attempt(sql, other, "ack", 30, duration=5)
    add_attempt(sql, queue, "ack", 61, second=0, duration=1)  # before the hour
    return queue, other


def test_attempts_land_in_their_minute(known, sql):
    points = dashboard_series.series()

    assert len(points) == 61
    assert [p.at for p in points] == [minute(sql, 60 - i) for i in range(61)]
    ten = by_minute(points)[minute(sql, 10)]
    assert (ten.delivered, ten.failed, ten.dead_lettered) == (3, 2, 1)
    assert ten.latency_p50_ms == 30
    assert ten.latency_p95_ms == pytest.approx(48)  # percentile_cont: 40 + 0.8 * (50 - 40)
    thirty = by_minute(points)[minute(sql, 30)]
    assert (thirty.delivered, thirty.failed, thirty.latency_p95_ms) == (1, 0, 5)
    others = [p for p in points if p.at not in (minute(sql, 10), minute(sql, 30))]
    # Empty minutes are zeros (no latency: there was no request).
    assert {(p.delivered, p.failed, p.dead_lettered, p.depth, p.unrouted) for p in others} == {
        (0, 0, 0, 0, 0)
    }
    assert {(p.latency_p50_ms, p.latency_p95_ms) for p in others} == {(None, None)}


def test_a_queue_or_a_worker_has_only_its_own(known, sql):

    mine = dashboard_series.series(queue="known_queue")
    assert sum(p.delivered for p in mine) == 3
    assert by_minute(mine)[minute(sql, 30)].delivered == 0
    theirs = dashboard_series.series(worker="other_worker")
    assert [(p.at, p.delivered) for p in theirs if p.delivered] == [(minute(sql, 30), 1)]
    assert sum(p.delivered for p in dashboard_series.series(queue="no_such_queue")) == 0


def test_the_sums_are_the_lists_figures(world, sql):  # noqa: F811
    by_queue = {m.queue_name: m for m in metrics.queues()}
    by_worker = {w.worker_name: w for w in metrics.workers()}

    for name, figures in by_queue.items():
        points = dashboard_series.series(queue=name)
        assert sum(p.delivered for p in points) == figures.delivered_last_hour, name
        assert sum(p.failed for p in points) == figures.failed_last_hour, name
        assert points[-1].depth == figures.queue_length, name
    for name, figures in by_worker.items():
        points = dashboard_series.series(worker=name)
        assert sum(p.delivered + p.failed for p in points) == figures.requests_last_hour
        assert sum(p.delivered for p in points) == figures.successes_last_hour
    everything = dashboard_series.series()
    assert sum(p.delivered for p in everything) == sum(
        m.delivered_last_hour for m in by_queue.values()
    )
    assert everything[-1].depth == sum(m.queue_length for m in by_queue.values())


def test_depth_follows_deliveries_in_and_out(sql, make_queue):
    queue = make_queue("depth.#", name="depth_queue")
    add_delivery(sql, queue, 180)  # live since before the hour: every minute
    add_delivery(sql, queue, 30)  # live from the minute 30 minutes back
    add_delivery(sql, queue, 20, state="leased")
    # Published 25 minutes back, acknowledged 15 minutes back at its first attempt.
    first = add_message(sql, "elsewhere.first", 25)
    add_attempt(sql, queue, "ack", 15, message=first)
    # Dead-lettered two hours back, requeued: retried 12 minutes back (its first attempt
    # since), acknowledged 8 minutes back. Its requeue is not kept: it counts from the
    # first attempt of its second life, not from its message's publication.
    again = add_message(sql, "elsewhere.again", 180)
    add_attempt(sql, queue, "dead", 120, message=again, attempt=6)
    add_attempt(sql, queue, "retry", 12, second=0, message=again, attempt=1)
    add_attempt(sql, queue, "ack", 8, message=again, attempt=2)

    depth = [p.depth for p in dashboard_series.series(queue="depth_queue")]

    expected = [
        1 + (k <= 30) + (k <= 20) + (15 < k <= 25) + (8 < k <= 12) for k in range(60, -1, -1)
    ]
    assert depth == expected
    assert depth[-1] == metrics.queue("depth_queue").queue_length == 3


def test_unrouted_messages_are_counted_in_their_minute(sql, make_queue):
    make_queue("routed.#", name="routed_queue")
    add_message(sql, "nowhere.a", 5)
    add_message(sql, "nowhere.b", 5, second=50)
    add_message(sql, "routed.x", 5)  # a delivery: routed
    add_message(sql, "nowhere.old", 90)  # before the hour

    points = by_minute(dashboard_series.series())

    assert points[minute(sql, 5)].unrouted == 2
    assert sum(p.unrouted for p in points.values()) == 2


# The page shows them.


def test_the_page_charts_the_known_minute(admin_client, known, sql):
    response = admin_client.get(DASHBOARD)

    charts = svgs(response)
    assert len(charts) == 4
    for svg in charts:  # parsed above: well-formed XML
        assert svg.attrib["class"] == "pgmb-chart" and svg.attrib["role"] == "img"
        assert svg.find(f"{{{SVG_NS}}}title").text == svg.attrib["aria-label"]
    outcomes = charts[0]
    assert outcomes.attrib["aria-label"].startswith("Delivered, failed and dead-lettered")
    hover = {t.text for t in outcomes.iter(f"{{{SVG_NS}}}title")}
    label = minute(sql, 10).strftime("%H:%M")  # the tests' time zone is UTC
    assert f"{label}: delivered 3, failed 2, dead-lettered 1, expired (TTL) 0" in hover
    latency = {t.text for t in charts[2].iter(f"{{{SVG_NS}}}title")}
    assert f"{label}: p50 30 ms, p95 48 ms" in latency
    assert "Last hour: 4 delivered, 2 failed (1 of them dead-lettered)." in (
        response.content.decode()
    )


def test_the_page_charts_a_chosen_queue_or_worker(admin_client, known, sql):
    label = minute(sql, 30).strftime("%H:%M")

    response = admin_client.get(DASHBOARD, {"queue": "other_queue"})
    hover = {t.text for t in svgs(response)[0].iter(f"{{{SVG_NS}}}title")}
    assert f"{label}: delivered 1, failed 0, dead-lettered 0, expired (TTL) 0" in hover
    assert "Last hour: 1 delivered, 0 failed" in response.content.decode()
    assert "queue other_queue" in response.content.decode()
    worker = admin_client.get(DASHBOARD, {"worker": "known_worker"})
    # Its queue's attempts are all in the last 15 minutes: the page opens on those.
    assert "Last 15 minutes: 3 delivered, 2 failed" in worker.content.decode()
    assert "queues of worker known_worker" in worker.content.decode()


def test_the_tables_show_the_metrics(admin_client, world):  # noqa: F811
    response = admin_client.get(DASHBOARD)

    queues = table(response, "pgmb-queues")
    for m in metrics.queues():
        row = queues[m.queue_name]
        assert int(row["pending"]) == m.queue_length
        assert int(row["ready"]) == m.queue_visible_length
        assert int(row["delayed"]) == m.queue_length - m.queue_visible_length - m.leased
        assert int(row["leased"]) == m.leased
        assert int(row["retrying"]) == m.retrying
        assert int(row["dead_letters"]) == m.dead_letters
        assert int(row["delivered_last_hour"]) == m.delivered_last_hour
        assert int(row["failed_last_hour"]) == m.failed_last_hour
    assert queues["busy_queue"]["oldest_due"] == "3m"
    assert "paused" in queues["idle_queue"]["state"]
    workers = table(response, "pgmb-workers")
    busy = workers["metrics_worker"]
    # The worker list's own texts (tests/admin/test_health.py).
    assert (busy["requests_last_hour"], busy["success_rate"], busy["p95_latency"]) == (
        "7",
        "57.1%",
        "67.0 ms",
    )
    assert (busy["last_error"], busy["consecutive_failures"]) == ("503: HTTP 503: busy", "2")
    assert busy["health"] == "healthy"
    assert workers["idle_worker"]["health"] == "idle"
    # The totals row adds the queues up, as the all-queue charts do.
    html = response.content.decode()
    total = html.split('<tr class="pgmb-total">', 1)[1].split("</tr>", 1)[0]
    delivered = sum(m.delivered_last_hour for m in metrics.queues())
    assert f'<td class="num field-delivered_last_hour">{delivered}</td>' in total
    assert f"Last hour: {delivered} delivered" in html


def test_the_lists_and_the_dashboard_agree(admin_client, world):  # noqa: F811
    dashboard = table(admin_client.get(DASHBOARD), "pgmb-queues")
    listed = admin_client.get(reverse("admin:pgmb_queue_changelist")).content.decode()
    for name, row in dashboard.items():
        line = listed.split(f">{name}</a>", 1)[1].split("</tr>", 1)[0]
        for column in ("ready", "delivered_last_hour", "failed_last_hour"):
            assert f'<td class="field-{column}">{row[column]}</td>' in line, (name, column)
        # What the list has no room for is on the queue's page.
        queue = Queue.objects.get(name=name)
        page = admin_client.get(reverse("admin:pgmb_queue_change", args=[queue.pk]))
        for column in ("leased", "retrying", "delivered_last_hour"):
            found = re.search(
                rf'field-{column}">.*?<div class="readonly">([^<]*)</div>',
                page.content.decode(),
                re.S,
            )
            assert found and found.group(1) == row[column], (name, column)


def test_running_and_gone_dispatchers_are_listed_and_stopped_ones_are_not(admin_client, sql):
    running = dispatcher_registry.start("external", "web-running", 101, ["order_queue"])
    dispatcher_registry.beat(running, 4, 40, 2)
    gone = dispatcher_registry.start("external", "web-gone", 102)
    sql(
        "UPDATE pgmb_dispatcher SET heartbeat_at = now() - interval '5 minutes' WHERE id = %s",
        (gone,),
    )
    stopped = dispatcher_registry.start("external", "web-stopped", 103)
    dispatcher_registry.stop(stopped, 1, 0)

    html = admin_client.get(DASHBOARD).content.decode()
    body = html.split('id="pgmb-dispatchers"', 1)[1].split("</table>", 1)[0]
    assert "web-running" in body and "web-gone" in body and "web-stopped" not in body
    line = body.split("web-running", 1)[1].split("</tr>", 1)[0]
    assert '<td class="num field-pid">101</td>' in line
    assert '<td class="field-queues">order_queue</td>' in line
    assert '<td class="num field-in_flight">4</td>' in line
    assert '<td class="num field-delivered">40</td>' in line
    assert "pgmb-state-running" in line
    assert "pgmb-state-gone" in body.split("web-gone", 1)[1].split("</tr>", 1)[0]


def test_without_dispatchers_the_table_says_so(admin_client):
    html = admin_client.get(DASHBOARD).content.decode()
    body = html.split('id="pgmb-dispatchers"', 1)[1].split("</table>", 1)[0]
    assert "No dispatcher is running" in body


def test_the_unrouted_chart_links_to_the_unrouted_messages(admin_client, sql):
    add_message(sql, "nowhere.a", 3)

    html = admin_client.get(DASHBOARD).content.decode()

    link = reverse("admin:pgmb_message_changelist") + "?routed=no"
    assert f'<a href="{link}">' in html
    assert "Last 15 minutes: 1 published message matched no queue." in html
    assert admin_client.get(link).status_code == 200


# Bad input: a clear error, no charts.


@pytest.mark.parametrize(
    ("params", "text"),
    [
        ({"queue": "no_such_queue"}, "Select a valid choice. no_such_queue is not one"),
        ({"worker": "no_such_worker"}, "Select a valid choice. no_such_worker is not one"),
        ({"range": "1y"}, "Select a valid choice. 1y is not one"),
        (
            {"queue": "known_queue", "worker": "known_worker"},
            "Choose a queue or a worker, not both",
        ),
    ],
)
def test_unknown_choices_are_refused_with_a_reason(admin_client, known, params, text):
    response = admin_client.get(DASHBOARD, params)

    assert response.status_code == 400
    html = response.content.decode()
    assert text in html
    assert 'class="pgmb-chart"' not in html
    assert 'id="pgmb-queues"' in html  # the tables are still there


# Cost: pinned queries, and a plan that reads the big tables through their indexes.


def test_the_page_takes_a_fixed_number_of_queries(
    admin_client, known, sql, make_queue, django_assert_num_queries
):
    admin_client.get(DASHBOARD)  # warm up: the session
    dispatcher_registry.start("external", "web", 1)
    for n in range(20):
        make_queue(f"more{n}.#", name=f"more_{n}")

    # The session, its user, a savepoint and its release (the page's transaction inside
    # the test's), the queues' and the workers' metrics, the series, the dispatchers.
    with django_assert_num_queries(8):
        response = admin_client.get(DASHBOARD)

    assert len(table(response, "pgmb-queues")) == 22


BIG = 100_000


def test_the_series_read_the_big_tables_through_indexes(
    fresh_statistics,
    sql,
    make_queue,
):
    queue = make_queue("big.#", name="big_queue")
    # BIG messages over ten days, in time order as publishing appends them, and an attempt
    # for each, generated in SQL (routing off: no deliveries).
    sql("ALTER TABLE pgmb_message DISABLE TRIGGER USER")
    sql(
        "INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at)"
        " SELECT gen_random_uuid(), 'big.' || (i %% 100), '{}', '{}',"
        " now() - (%s - i) * interval '8 seconds', now() FROM generate_series(1, %s) AS i",
        (BIG, BIG),
    )
    sql("ALTER TABLE pgmb_message ENABLE TRIGGER USER")
    sql(
        "INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code,"
        " duration_ms, error, created_at)"
        " SELECT m.id, %s, 1, CASE WHEN random() < 0.2 THEN 'retry' ELSE 'ack' END, 200, 1, '',"
        " m.created_at + interval '1 second' FROM pgmb_message m",
        (queue.pk,),
    )
    sql("ANALYZE pgmb_message, pgmb_attempt, pgmb_delivery, pgmb_dead_letter")
    statement = pgmb_sql.query("dashboard.sql", "live_minutes")

    for params in ({"queue": None, "worker": None}, {"queue": "big_queue", "worker": None}):
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {statement}", params)
            (plan,) = cursor.fetchone()
        # The history tables are partitioned by day (decision 0076): a scan of a partition,
        # or of a partition's index, counts as one of the table's or the index's.
        scans = [
            (kind, partitioned(sql, name))
            for kind, name in plan_scans_of(plan)
            if not (kind == "Seq Scan" and empty_partition(sql, name))
        ]
        assert ("Seq Scan", "pgmb_message") not in scans, scans
        assert ("Seq Scan", "pgmb_attempt") not in scans, scans
        assert "pgmb_message_created" in {index for _, index in scans}
        assert "pgmb_attempt_created" in {index for _, index in scans}
    # And it computes the hour: ~450 messages, each with its attempt.
    points = dashboard_series.series()
    assert 400 < sum(p.delivered + p.failed for p in points) < 500
    assert sum(p.unrouted for p in points) == 0


def partitioned(sql, name: str | None) -> str | None:
    """The partitioned table or index that ``name`` is a partition of, else ``name``."""
    if name is None:
        return None
    [(parent,)] = sql(
        "SELECT coalesce((SELECT i.inhparent::regclass::text FROM pg_inherits i"
        " WHERE i.inhrelid = to_regclass(%s)), %s)",
        (name, name),
    )
    return parent


def empty_partition(sql, name: str | None) -> bool:
    """Whether ``name`` is a partition of a few pages at most (a day ahead, or today's in a
    test database): its Seq Scan reads next to nothing."""
    [(empty,)] = sql(
        "SELECT coalesce((SELECT c.relispartition AND c.relpages < 16"
        " FROM pg_class c WHERE c.oid = to_regclass(%s)), false)",
        (name,),
    )
    return bool(empty)


def plan_scans_of(plan) -> list[tuple[str, str | None]]:
    """(node type, index, or relation if no index) of every scan of a JSON plan."""
    plan = plan if isinstance(plan, list) else json.loads(plan)
    found, todo = [], [plan[0]["Plan"]]
    while todo:
        node = todo.pop()
        if "Scan" in node["Node Type"]:
            found.append((node["Node Type"], node.get("Index Name") or node.get("Relation Name")))
        todo.extend(node.get("Plans", []))
    return found


def chosen_range(response) -> str:
    html = response.content.decode()
    select = html[html.index('name="range"') : html.index("</select>", html.index('name="range"'))]
    return re.search(r'<option value="([^"]*)" selected>', select).group(1)


def slots(svg: ET.Element) -> int:
    return len(svg.find(f"{{{SVG_NS}}}g[@class='pgmb-chart-hover']"))


def test_a_short_history_opens_on_its_last_15_minutes(admin_client, make_queue, sql):
    queue = make_queue("short.#", name="short_queue")
    add_attempt(sql, queue, "ack", 12, duration=7)
    add_attempt(sql, queue, "ack", 2, duration=9)

    opened = admin_client.get(DASHBOARD)

    assert chosen_range(opened) == "15m"
    assert "Last 15 minutes: 2 delivered, 0 failed" in opened.content.decode()
    assert [slots(svg) for svg in svgs(opened)] == [16, 16, 16, 16]
    # Asked for, the hour is the hour.
    hour = admin_client.get(DASHBOARD, {"range": "1h"})
    assert chosen_range(hour) == "1h"
    assert [slots(svg) for svg in svgs(hour)] == [61, 61, 61, 61]
    assert "Last hour: 2 delivered, 0 failed" in hour.content.decode()


def test_a_history_older_than_15_minutes_opens_on_the_hour(admin_client, make_queue, sql):
    queue = make_queue("long.#", name="long_queue")
    add_attempt(sql, queue, "ack", 40, duration=7)
    add_attempt(sql, queue, "ack", 2, duration=9)

    opened = admin_client.get(DASHBOARD)

    assert chosen_range(opened) == "1h"
    assert "Last hour: 2 delivered, 0 failed" in opened.content.decode()
    assert slots(svgs(opened)[0]) == 61


def test_latency_is_drawn_as_lines_even_in_a_lone_minute(admin_client, make_queue, sql):
    queue = make_queue("lone.#", name="lone_queue")
    add_attempt(sql, queue, "ack", 5, duration=12)

    latency = svgs(admin_client.get(DASHBOARD))[2]

    data = latency.find(f"{{{SVG_NS}}}g[@class='pgmb-chart-data']")
    assert data.findall(f"{{{SVG_NS}}}circle") == []
    lines = data.findall(f"{{{SVG_NS}}}polyline")
    assert len(lines) == 2  # p50 and p95, each level across its minute
    for line in lines:
        (x1, y1), (x2, y2) = (map(float, p.split(",")) for p in line.attrib["points"].split())
        assert y1 == y2 and x2 > x1


def test_the_page_counts_expirations_by_ttl_apart_from_failures(admin_client, make_queue):
    """Outcome 'ttl' (docs/delivery.md, Expiry): its own series, not a failure; 'expired'
    alone stays a lease's."""
    make_queue("exp.#", name="expiring")
    for _ in range(2):
        pgmb.send(
            "exp.a", {}, expires_at=datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
        )
    assert deliveries.expire() == 2
    page = admin_client.get(DASHBOARD, {"queue": "expiring"}).content.decode()
    assert (
        "0 delivered, 0 failed (0 of them dead-lettered). "
        "2 expired (TTL) before they were delivered." in page
    )
