"""Dispatchers in the admin: a read-only list with their state, not-stopped by default."""

from pgmb import dispatcher_registry

from .conftest import table_rows, url


def _register(host: str, *, stopped: bool = False, gone: bool = False, sql=None) -> int:
    me = dispatcher_registry.start("external", host, 100, ["order_queue", "audit_queue"])
    dispatcher_registry.beat(me, 2, 40, 3)
    if stopped:
        dispatcher_registry.stop(me, 41, 3)
    if gone:
        sql(
            "UPDATE pgmb_dispatcher SET heartbeat_at = now() - interval '2 minutes' WHERE id = %s",
            (me,),
        )
    return me


def test_the_list_shows_running_and_gone_dispatchers_by_default(admin_client, db, sql):
    _register("web-running")
    _register("web-gone", gone=True, sql=sql)
    _register("web-stopped", stopped=True)
    in_db = dispatcher_registry.start("in_database", "local", 777, None)

    response = admin_client.get(url("dispatcherprocess_changelist"))

    assert response.status_code == 200
    rows = {row.split('class="field-host">')[1].split("<")[0]: row for row in table_rows(response)}
    assert set(rows) == {"web-running", "web-gone", "local"}
    running = rows["web-running"]
    assert "pgmb-state-running" in running
    assert '<td class="field-pid">100</td>' in running
    assert "order_queue, audit_queue" in running
    assert '<td class="field-in_flight">2</td>' in running
    assert '<td class="field-delivered">40</td>' in running
    assert '<td class="field-failed">3</td>' in running
    assert "pgmb-state-gone" in rows["web-gone"]
    assert "in the database" in rows["local"] and ">all<" in rows["local"]

    everything = admin_client.get(url("dispatcherprocess_changelist") + "?state=all")
    assert len(table_rows(everything)) == 4
    stopped = admin_client.get(url("dispatcherprocess_changelist") + "?state=stopped")
    [row] = table_rows(stopped)
    assert "web-stopped" in row and "pgmb-state-stopped" in row and ">41<" in row
    gone = admin_client.get(url("dispatcherprocess_changelist") + "?state=gone")
    assert ["web-gone" in r for r in table_rows(gone)] == [True]
    assert in_db


def test_the_list_is_read_only(admin_client, db):
    me = _register("web-1")
    assert admin_client.get(url("dispatcherprocess_add")).status_code == 403
    assert (
        admin_client.post(url("dispatcherprocess_delete", me), {"post": "yes"}).status_code == 403
    )
    page = admin_client.get(url("dispatcherprocess_change", me))
    assert page.status_code == 200  # a view-only page
    assert b'name="_save"' not in page.content
    changelist = admin_client.get(url("dispatcherprocess_changelist"))
    assert b'name="action"' not in changelist.content
    assert dispatcher_registry.dispatchers()[0].state == "running"


def test_the_list_takes_the_same_queries_whatever_its_length(
    admin_client, db, count_queries, django_assert_num_queries
):
    for n in range(3):
        _register(f"web-{n}")
    admin_client.get(url("dispatcherprocess_changelist"))  # warm up: the session, caches
    few = count_queries(lambda: admin_client.get(url("dispatcherprocess_changelist")))
    for n in range(3, 30):
        _register(f"web-{n}")

    with django_assert_num_queries(few):
        response = admin_client.get(url("dispatcherprocess_changelist"))

    assert len(table_rows(response)) == 30
    assert few <= 6  # session, user, count, filtered count, rows (pinned)
