"""The message lists' filters and searches: what each one lists, bad values refused, the
windows of the questions only per-message probes can answer, the orderings offered, and
each list page's queries, pinned. (Their plans on big tables: test_big_tables.py.)"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.contrib.admin.templatetags.admin_list import result_headers
from django.utils import timezone

from pgmb.models import Attempt, DeadLetter, Delivery, Message

from .conftest import url


@pytest.fixture
def world(make_worker, make_queue):
    """Two workers, three queues, six messages published over ten days, and rows of each
    kind on each queue. Bound to keys no message has: the rows below are all there is."""
    now = timezone.now()
    web, batch = make_worker("web"), make_worker("batch")
    qa = make_queue("never.a.#", name="qa", worker=web)
    qb = make_queue("never.b.#", name="qb", worker=web)
    qc = make_queue("never.c.#", name="qc", worker=batch)

    # Published 0, 2, 4, ... days ago (created_at is set on insert: updated after).
    keys = ["order.created", "order.paid", "user.created", "Order.created", "audit.x", "lost.x"]
    ids: dict[str, uuid.UUID] = {}
    for n, key in enumerate(keys):
        at = now - timedelta(days=2 * n)
        ids[key] = Message.objects.create(routing_key=key, body={}, available_at=at).pk
        Message.objects.filter(pk=ids[key]).update(created_at=at)

    def delivery(key, queue, *, state="ready", available):
        return Delivery.objects.create(
            message_id=ids[key], queue=queue, state=state, available_at=now + available,
            created_at=now,
        )  # fmt: skip

    due = delivery("order.created", qa, available=timedelta(seconds=-5))
    delayed = delivery("order.paid", qa, available=timedelta(minutes=5))
    leased = delivery("user.created", qb, state="leased", available=timedelta(minutes=1))
    expired = delivery("order.created", qc, state="leased", available=timedelta(seconds=-1))

    def dead(key, queue, status, days_ago):
        return DeadLetter.objects.create(
            message_id=ids[key], queue=queue, attempts=3, last_status=status,
            created_at=now - timedelta(days=days_ago),
        )  # fmt: skip

    dead_500 = dead("order.paid", qb, 500, 0)
    dead_404 = dead("audit.x", qc, 404, 9)
    dead_none = dead("Order.created", qa, None, 1)

    def attempt(key, queue, outcome, status, days_ago=0.0):
        return Attempt.objects.create(
            message_id=ids[key], queue=queue, attempt=1, outcome=outcome, status_code=status,
            created_at=now - timedelta(days=days_ago),
        )  # fmt: skip

    return {
        "now": now,
        "ids": ids,
        "queues": {"qa": qa, "qb": qb, "qc": qc},
        "workers": {"web": web, "batch": batch},
        "deliveries": {"due": due, "delayed": delayed, "leased": leased, "expired": expired},
        "dead": {"500": dead_500, "404": dead_404, "none": dead_none},
        "attempts": {
            "ack": attempt("order.created", qa, "ack", 200),
            # pgmb.ack() from SQL may record no status: an acknowledgement all the same.
            "sql_ack": attempt("user.created", qb, "ack", None),
            "503": attempt("order.paid", qa, "retry", 503, days_ago=1),
            "429": attempt("order.paid", qb, "retry", 429),
            "500": attempt("order.paid", qb, "dead", 500),
            "timeout": attempt("audit.x", qc, "retry", None, days_ago=8),
            "expired": attempt("Order.created", qc, "expired", None),
        },
    }


def listed(client, page: str, **params) -> set:
    response = client.get(url(f"{page}_changelist"), params)
    assert response.status_code == 200, response.get("Location")
    return {row.pk for row in response.context["cl"].result_list}


def pks(*rows) -> set:
    return {row.pk for row in rows}


# Filters.


def test_delivery_status_is_the_status_column(admin_client, world):
    d = world["deliveries"]

    # A lease that ran out is ready again, as the status column says.
    assert listed(admin_client, "delivery", status="ready") == pks(d["due"], d["expired"])
    assert listed(admin_client, "delivery", status="delayed") == pks(d["delayed"])
    assert listed(admin_client, "delivery", status="leased") == pks(d["leased"])


@pytest.mark.parametrize("page", ["delivery", "deadletter", "attempt"])
def test_queue_and_worker_filters(admin_client, world, page):
    model = {"delivery": Delivery, "deadletter": DeadLetter, "attempt": Attempt}[page]
    queues, workers = world["queues"], world["workers"]

    for queue in queues.values():
        expected = set(model.objects.filter(queue=queue).values_list("pk", flat=True))
        assert listed(admin_client, page, queue__id__exact=str(queue.pk)) == expected
    for worker in workers.values():
        expected = set(model.objects.filter(queue__worker=worker).values_list("pk", flat=True))
        assert expected  # every worker has rows of every kind here
        assert listed(admin_client, page, worker=str(worker.pk)) == expected


def test_worker_without_queues_lists_nothing(admin_client, world, make_worker):
    idle = make_worker("idle")

    assert listed(admin_client, "attempt", worker=str(idle.pk)) == set()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2xx", ["ack"]),
        ("4xx", ["429"]),
        ("5xx", ["503", "500"]),
        # Failures without a response; the acknowledgement without a status is not one.
        ("none", ["timeout", "expired"]),
        ("3xx", []),
    ],
)
def test_attempt_status_classes(admin_client, world, value, expected):
    attempts = world["attempts"]

    shown = listed(admin_client, "attempt", status_code_class=value)

    assert shown == pks(*(attempts[name] for name in expected))


@pytest.mark.parametrize(
    ("value", "expected"), [("5xx", ["500"]), ("4xx", ["404"]), ("none", ["none"]), ("2xx", [])]
)
def test_dead_letter_status_classes(admin_client, world, value, expected):
    shown = listed(admin_client, "deadletter", last_status_class=value)

    assert shown == pks(*(world["dead"][name] for name in expected))


def test_outcome_filter(admin_client, world):
    attempts = world["attempts"]

    assert listed(admin_client, "attempt", outcome__exact="ack") == pks(
        attempts["ack"], attempts["sql_ack"]
    )
    assert listed(admin_client, "attempt", outcome__exact="dead") == pks(attempts["500"])


@pytest.mark.parametrize("page", ["message", "deadletter", "attempt"])
def test_date_filter_past_week(admin_client, world, page):
    today = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    since = today - timedelta(days=7)
    model = {"message": Message, "deadletter": DeadLetter, "attempt": Attempt}[page]
    response = admin_client.get(url(f"{page}_changelist"))
    assert "Past 7 days" in response.content.decode()

    shown = listed(
        admin_client,
        page,
        created_at__gte=str(since),
        created_at__lt=str(today + timedelta(days=1)),
    )

    expected = set(model.objects.filter(created_at__gte=since).values_list("pk", flat=True))
    assert shown == expected
    assert expected != set(model.objects.values_list("pk", flat=True))  # some are older


@pytest.mark.parametrize(
    ("page", "params"),
    [
        ("delivery", {"queue__id__exact": "not-a-uuid"}),
        ("attempt", {"worker": "12345"}),
        ("attempt", {"status_code_class": "6xx"}),
        ("deadletter", {"last_status_class": "teapot"}),
    ],
)
def test_bad_filter_values_are_refused(admin_client, world, page, params):
    response = admin_client.get(url(f"{page}_changelist"), params)

    # Django's answer to lookup parameters it cannot use: the unfiltered list, flagged.
    assert response.status_code == 302
    assert response["Location"].endswith("?e=1")


# Search.


def test_search_by_message_id_everywhere(admin_client, world):
    mid = world["ids"]["order.paid"]

    assert listed(admin_client, "message", q=str(mid)) == {mid}
    assert listed(admin_client, "delivery", q=f"  {mid} ") == pks(world["deliveries"]["delayed"])
    assert listed(admin_client, "deadletter", q=str(mid)) == pks(world["dead"]["500"])
    assert listed(admin_client, "attempt", q=str(mid)) == pks(
        *(world["attempts"][n] for n in ("503", "429", "500"))
    )


def test_routing_key_search_is_a_case_sensitive_prefix(admin_client, world):
    ids = world["ids"]

    assert listed(admin_client, "message", q="order.") == {ids["order.created"], ids["order.paid"]}
    assert listed(admin_client, "message", q="Order") == {ids["Order.created"]}
    assert listed(admin_client, "message", q="created") == set()  # not a prefix
    assert listed(admin_client, "delivery", q="order.") == pks(
        *(world["deliveries"][n] for n in ("due", "delayed", "expired"))
    )
    assert listed(admin_client, "deadletter", q="Order.") == pks(world["dead"]["none"])
    assert listed(admin_client, "attempt", q="audit") == pks(world["attempts"]["timeout"])


def test_key_search_of_the_rows_looks_among_the_newest_messages(admin_client, world, monkeypatch):
    # order.created (newest) and order.paid (2 days older) both start with "order.": with a
    # window of one message, the attempts of order.created only.
    monkeypatch.setattr("pgmb.admin.common.MESSAGE_WINDOW", 1)

    assert listed(admin_client, "attempt", q="order.") == pks(world["attempts"]["ack"])
    # The message list itself is not windowed: its index answers the prefix directly.
    assert len(listed(admin_client, "message", q="order.")) == 2


def test_unrouted_filter_looks_among_the_newest_messages(admin_client, world, monkeypatch):
    ids = world["ids"]
    # Nothing refers to lost.x, the oldest message.
    assert listed(admin_client, "message", routed="no") == {ids["lost.x"]}
    routed = set(ids.values()) - {ids["lost.x"]}
    assert listed(admin_client, "message", routed="yes") == routed

    monkeypatch.setattr("pgmb.admin.messages.MESSAGE_WINDOW", 5)

    assert listed(admin_client, "message", routed="no") == set()
    page = admin_client.get(url("message_changelist")).content.decode()
    assert "No: matched no queue (among the newest 5)" in page


# Orderings: only those an index serves are offered.


@pytest.mark.parametrize(
    ("page", "sortable"),
    [
        ("message", {"created_time"}),  # the column of created_at (pgmb.admin.stored_times)
        ("delivery", {"id"}),
        ("deadletter", {"id", "created_at"}),
        ("attempt", {"created_at"}),
    ],
)
def test_only_indexed_orderings_are_offered(admin_client, world, page, sortable):
    cl = admin_client.get(url(f"{page}_changelist")).context["cl"]

    offered = {
        re.search(r"column-(\w+)", header["class_attrib"]).group(1)
        for header in result_headers(cl)
        if header["sortable"]
    }

    assert offered == sortable


# Query counts, pinned: the same for a few rows and for many.

#: Each list page's queries, after the session's and the user's two: the filters' choices
#: (queues, workers), the count (the table's estimate; it is small here, so a COUNT too),
#: the page's rows, and what the page hangs on them (the routed flags, the figures).
PAGE_QUERIES = {
    "message": 2 + 2 + 1 + 1,  # estimate, COUNT, rows, pgmb.unrouted()
    "delivery": 2 + 2 + 2 + 1,  # queues, workers, estimate, COUNT, rows
    "deadletter": 2 + 2 + 2 + 1,
    "attempt": 2 + 2 + 2 + 1,
    "queue": 2 + 1 + 2 + 1 + 1,  # workers, COUNT twice (small table), rows, figures
    "worker": 2 + 2 + 1 + 1,  # COUNT twice, rows, figures
}


def add_rows(make_queue, n: int) -> None:
    """n more messages, each with a row of every kind on a new queue of a new worker."""
    now = timezone.now()
    for i in range(n):
        queue = make_queue(f"never.more.{i}.#")
        mid = Message.objects.create(routing_key=f"more.{i}", body={}, available_at=now).pk
        Delivery.objects.create(message_id=mid, queue=queue, available_at=now, created_at=now)
        DeadLetter.objects.create(message_id=mid, queue=queue, attempts=1, created_at=now)
        Attempt.objects.create(
            message_id=mid, queue=queue, attempt=1, outcome="ack", status_code=200, created_at=now
        )


@pytest.mark.parametrize("page", sorted(PAGE_QUERIES))
def test_list_page_queries_are_pinned(
    fresh_statistics, admin_client, world, make_queue, sql, django_assert_num_queries, page
):
    # Analyzed, as autovacuum keeps real tables: the estimate is then one read of pg_class.
    sql("ANALYZE pgmb_message, pgmb_delivery, pgmb_dead_letter, pgmb_attempt")
    admin_client.get(url(f"{page}_changelist"))  # warm up: the session, caches
    with django_assert_num_queries(PAGE_QUERIES[page]):
        few = admin_client.get(url(f"{page}_changelist"))
    add_rows(make_queue, 20)
    sql("ANALYZE pgmb_message, pgmb_delivery, pgmb_dead_letter, pgmb_attempt")

    with django_assert_num_queries(PAGE_QUERIES[page]):
        many = admin_client.get(url(f"{page}_changelist"))

    assert len(many.context["cl"].result_list) > len(few.context["cl"].result_list)
