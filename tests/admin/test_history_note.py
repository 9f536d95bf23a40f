"""A pull queue that keeps no history: the dashboard, the queue list and /metrics say what
they cannot count for it (its deletes), and count the rest as before."""

from __future__ import annotations

import re

from django.db import connection

import pgmb
from pgmb import metrics, pull
from pgmb.models import Queue
from tests.admin.conftest import form_errors, url
from tests.admin.test_dashboard import DASHBOARD, table
from tests.admin.test_queues import queue_data
from tests.metrics.test_prometheus import parse


def _consume(queue: Queue, n: int) -> None:
    for i in range(n):
        pgmb.send(f"{queue.name}.job", {"n": i})
    pull.delete(queue.name, pull.read(queue.name, 30, n))


def _queues(db) -> tuple[Queue, Queue]:
    kept = Queue.objects.create(name="kept", binding_key="kept.#")
    bare = Queue.objects.create(name="bare", binding_key="bare.#", keep_history=False)
    _consume(kept, 2)
    _consume(bare, 3)
    return kept, bare


def test_the_dashboard_names_the_queues_without_history(admin_client, db):
    _queues(db)
    response = admin_client.get(DASHBOARD)
    assert response.status_code == 200
    rows = table(response, "pgmb-queues")
    assert rows["kept"]["delivered_last_hour"] == "2"
    assert rows["bare"]["delivered_last_hour"] == "not kept"
    html = response.content.decode()
    (note,) = re.findall(r'<p class="pgmb-history-note">(.*?)</p>', html, re.S)
    assert "Keep no history: bare." in note
    assert "missing from the delivered counts" in note
    # The total adds what is known.
    total = html.split('class="pgmb-total"', 1)[1].split("</tr>", 1)[0]
    assert re.search(r'field-delivered_last_hour">2<', total)


def test_no_note_while_every_queue_keeps_its_history(admin_client, db):
    Queue.objects.create(name="kept", binding_key="kept.#")
    html = admin_client.get(DASHBOARD).content.decode()
    assert "pgmb-history-note" not in html


def test_the_queue_list_says_not_kept(admin_client, db):
    _queues(db)
    html = admin_client.get("/admin/pgmb/queue/").content.decode()
    cells = dict(
        re.findall(
            r'<th class="field-name"><a [^>]*>(\w+)</a></th>.*?'
            r'<td class="field-delivered_last_hour">(.*?)</td>',
            html,
            re.S,
        )
    )
    assert cells == {"bare": "not kept", "kept": "2"}
    # The setting is on the queue's form.
    bare = Queue.objects.get(name="bare")
    form = admin_client.get(f"/admin/pgmb/queue/{bare.pk}/change/").content.decode()
    assert 'name="keep_history"' in form


def test_metrics_leave_out_what_they_cannot_count(db):
    _queues(db)
    snapshot = metrics.collect()
    by_name = {q.queue_name: q for q in snapshot.queues}
    assert (by_name["kept"].keeps_history, by_name["bare"].keeps_history) == (True, False)
    assert metrics.queue("bare").keeps_history is False
    families, samples = parse(metrics.render(snapshot))
    assert samples[("pgmb_queue_keeps_history", "queue", "bare")] == 0
    assert samples[("pgmb_queue_keeps_history", "queue", "kept")] == 1
    assert samples[("pgmb_queue_delivered_last_hour", "queue", "kept")] == 2
    assert ("pgmb_queue_delivered_last_hour", "queue", "bare") not in samples
    assert ("pgmb_queue_total_messages", "queue", "bare") not in samples
    assert "keeps no history" in families["pgmb_queue_delivered_last_hour"][1]
    # What is still counted: its live deliveries.
    pgmb.send("bare.job", {"n": 9})
    assert metrics.queue("bare").queue_length == 1
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pgmb_attempt a JOIN pgmb_queue q ON q.id = a.queue_id"
            " WHERE q.name = 'bare'"
        )
        assert cursor.fetchone() == (0,)


def test_the_queue_form_sets_it_for_pull_queues_and_keeps_it_for_push_queues(
    admin_client, make_worker
):
    worker = make_worker("shop")
    # The box unchecked (a browser sends nothing): off for a pull queue ...
    pull_data = queue_data(worker, worker="", name="bare_q", binding_key="bare.#")
    assert form_errors(admin_client.post(url("queue_add"), pull_data)) == {}
    assert Queue.objects.get(name="bare_q").keep_history is False
    # ... kept on for a queue with a worker.
    assert form_errors(admin_client.post(url("queue_add"), queue_data(worker))) == {}
    assert Queue.objects.get(name="order_queue").keep_history is True
    checked = queue_data(worker, worker="", name="kept_q", binding_key="k.#", keep_history="on")
    assert form_errors(admin_client.post(url("queue_add"), checked)) == {}
    assert Queue.objects.get(name="kept_q").keep_history is True
