"""Messages, deliveries, dead letters and attempts in the admin: read-only, and "routed"
agrees with the SQL view pgmb.messages."""

import re
import uuid

import pytest
from django.utils import timezone

import pgmb
from pgmb import deliveries
from pgmb.models import Attempt, DeadLetter, Delivery, Message

from .conftest import table_rows, url


def routed_in_admin(response) -> dict[str, bool]:
    """{message id: routed?} of a message changelist page."""
    found = {}
    for row in table_rows(response):
        message_id = re.search(r'class="field-id"><a href="[^"]*">([0-9a-f-]{36})</a>', row)
        icon = re.search(r'class="field-is_routed"><img [^>]*alt="(True|False)"', row)
        found[message_id.group(1)] = icon.group(1) == "True"
    return found


@pytest.fixture
def stages(make_queue):
    """One message at each stage a message can be in, and one that matched no queue."""
    orders = make_queue("order.*", name="orders", max_retries=1)
    live = pgmb.send("order.created", {"stage": "live"})
    dead = pgmb.send("order.created", {"stage": "dead"})
    acked = pgmb.send("order.created", {"stage": "acked"})
    unrouted = pgmb.send("user.created", {"stage": "unrouted"})
    now = timezone.now()
    Delivery.objects.filter(message_id__in=[dead, acked]).delete()
    DeadLetter.objects.create(
        message_id=dead, queue=orders, attempts=2, last_status=503, created_at=now
    )
    Attempt.objects.bulk_create(
        [
            Attempt(message_id=dead, queue=orders, attempt=1, outcome="retry", status_code=503,
                    created_at=now),
            Attempt(message_id=dead, queue=orders, attempt=2, outcome="dead", status_code=503,
                    error="Service Unavailable", created_at=now),
            Attempt(message_id=acked, queue=orders, attempt=1, outcome="ack", status_code=200,
                    duration_ms=12.5, created_at=now),
        ]
    )  # fmt: skip
    return {"live": live, "dead": dead, "acked": acked, "unrouted": unrouted, "queue": orders}


def test_changelist_routed_column_matches_the_sql_view(admin_client, stages, sql):
    response = admin_client.get(url("message_changelist"))

    assert response.status_code == 200
    shown = routed_in_admin(response)
    assert shown == {
        str(stages["live"]): True,
        str(stages["dead"]): True,
        str(stages["acked"]): True,
        str(stages["unrouted"]): False,
    }
    assert shown == {
        str(mid): routed for mid, routed in sql("SELECT id, routed FROM pgmb.messages")
    }
    page = response.content.decode()
    assert "order.created" in page
    assert "user.created" in page


@pytest.mark.parametrize(
    ("value", "expected"), [("no", ["unrouted"]), ("yes", ["live", "dead", "acked"])]
)
def test_routed_filter(admin_client, stages, value, expected):
    response = admin_client.get(url("message_changelist"), {"routed": value})

    assert set(routed_in_admin(response)) == {str(stages[s]) for s in expected}
    assert "No: matched no queue" in response.content.decode()


def test_search_by_message_id_and_routing_key(admin_client, stages):
    by_id = admin_client.get(url("message_changelist"), {"q": str(stages["dead"])})
    by_key = admin_client.get(url("message_changelist"), {"q": "user."})

    assert list(routed_in_admin(by_id)) == [str(stages["dead"])]
    assert list(routed_in_admin(by_key)) == [str(stages["unrouted"])]


def test_detail_is_read_only_with_pretty_json_and_what_became_of_it(admin_client, make_queue):
    make_queue("order.*", name="orders")
    make_queue("#", name="audit")
    mid = pgmb.send(
        "order.created", {"order": {"id": 7, "items": ["pen"]}}, headers={"tenant": "acme"}
    )
    audit = Delivery.objects.get(message_id=mid, queue__name="audit")
    audit.delete()
    now = timezone.now()
    DeadLetter.objects.create(
        message_id=mid, queue=audit.queue, attempts=6, last_status=500,
        last_error="boom from the worker", created_at=now,
    )  # fmt: skip
    Attempt.objects.create(
        message_id=mid, queue=audit.queue, attempt=6, outcome="dead", status_code=500,
        error="boom from the worker", created_at=now,
    )  # fmt: skip

    response = admin_client.get(url("message_change", mid))

    assert response.status_code == 200
    page = response.content.decode()
    assert "View message" in page
    assert 'name="_save"' not in page
    form = page.split('id="message_form"', 1)[1].split("</form>", 1)[0]
    # Nothing to edit: the only inputs are hidden ones (csrf, the inlines' management forms).
    assert all('type="hidden"' in tag for tag in re.findall(r"<input[^>]*>", form))
    assert "<textarea" not in form
    assert "<select" not in form
    # Body and headers are pretty-printed (and escaped).
    assert (
        "{\n  &quot;order&quot;: {\n    &quot;id&quot;: 7,\n    &quot;items&quot;: [\n"
        "      &quot;pen&quot;\n    ]\n  }\n}"
    ) in page
    assert "{\n  &quot;tenant&quot;: &quot;acme&quot;\n}" in page
    # The inlines: the live delivery to "orders", the dead letter and attempt of "audit".
    deliveries = page.split('id="deliveries-group"', 1)[1].split("</table>", 1)[0]
    assert ">orders<" in deliveries
    assert "ready" in deliveries
    dead_letters = page.split('id="dead_letters-group"', 1)[1].split("</table>", 1)[0]
    assert ">audit<" in dead_letters
    # Each links to its own page, where its buttons are.
    live = Delivery.objects.get(message_id=mid, queue__name="orders")
    dead = DeadLetter.objects.get(message_id=mid)
    assert url("delivery_change", live.pk) in deliveries
    assert url("deadletter_change", dead.pk) in dead_letters
    assert "boom from the worker" in dead_letters
    attempts = page.split('id="attempts-group"', 1)[1].split("</table>", 1)[0]
    assert "dead-lettered" in attempts
    assert "500" in attempts


def test_messages_cannot_be_added_changed_or_deleted(admin_client, make_queue):
    make_queue("#")
    mid = pgmb.send("order.created", {"n": 1})

    add = admin_client.get(url("message_add"))
    change = admin_client.post(
        url("message_change", mid), {"routing_key": "x.y", "body": "{}", "available_at": ""}
    )
    delete = admin_client.post(url("message_delete", mid), {"post": "yes"})

    assert (add.status_code, change.status_code, delete.status_code) == (403, 403, 403)
    message = Message.objects.get(pk=mid)
    assert (message.routing_key, message.body) == ("order.created", {"n": 1})
    assert Delivery.objects.filter(message_id=mid).count() == 1


def test_delivery_dead_letter_and_attempt_lists(admin_client, stages):
    deliveries = admin_client.get(url("delivery_changelist")).content.decode()
    dead_letters = admin_client.get(url("deadletter_changelist")).content.decode()
    attempts = admin_client.get(url("attempt_changelist")).content.decode()

    assert str(stages["live"]) in deliveries
    assert f'href="/admin/pgmb/message/{stages["live"]}/change/"' in deliveries
    assert str(stages["dead"]) not in deliveries
    assert str(stages["dead"]) in dead_letters
    assert "503" in dead_letters
    assert attempts.count(f'title="{stages["dead"]}"') == 2
    assert attempts.count(f'title="{stages["acked"]}"') == 1
    assert "acknowledged" in attempts
    assert "12.5 ms" in attempts
    for name in ("delivery", "deadletter", "attempt"):
        assert admin_client.get(url(f"{name}_add")).status_code == 403


def test_attempt_list_survives_a_deleted_queue(admin_client, make_queue):
    queue = make_queue("#", name="gone")
    mid = pgmb.send("a.b", {})
    Attempt.objects.create(
        message_id=mid, queue=queue, attempt=1, outcome="ack", status_code=200,
        created_at=timezone.now(),
    )  # fmt: skip
    queue_id = queue.pk
    queue.delete()

    page = admin_client.get(url("attempt_changelist")).content.decode()

    assert f"{queue_id} (deleted)" in page


def test_lists_search_by_routing_key_prefix_taken_literally(admin_client, make_queue):
    # The lists of a message's rows find the messages by key in SQL of their own
    # (admin.sql: newest_with_key): LIKE's wildcards in the term are plain characters there.
    make_queue("#", name="everything")
    literal = pgmb.send("a_b.created", {})
    pgmb.send("axb.created", {})

    def listed(term: str) -> list[str]:
        response = admin_client.get(url("delivery_changelist"), {"q": term})
        return [str(d.message_id) for d in response.context["cl"].result_list]

    assert listed("a_b") == [str(literal)]
    assert listed("a%") == []
    assert len(listed("a")) == 2


def test_lists_search_by_message_id(admin_client, stages):
    response = admin_client.get(url("attempt_changelist"), {"q": str(stages["acked"])})

    assert len(table_rows(response)) == 1
    assert admin_client.get(url("attempt_changelist"), {"q": str(uuid.uuid4())}).status_code == 200


def test_changelist_queries_do_not_grow_with_rows(
    admin_client, make_queue, count_queries, django_assert_max_num_queries
):
    make_queue("order.*")

    def publish(n):
        pgmb.send_batch(
            [("order.created" if i % 2 else "user.created", {"i": i}) for i in range(n)]
        )

    publish(3)
    admin_client.get(url("message_changelist"))  # warm up: the session, caches
    few = count_queries(lambda: admin_client.get(url("message_changelist")))
    publish(27)

    with django_assert_max_num_queries(few):
        response = admin_client.get(url("message_changelist"))

    routed = routed_in_admin(response)
    assert len(routed) == 30
    assert sum(routed.values()) == 14  # the order.created ones


def test_a_deliverys_page_shows_its_message_and_its_attempts(admin_client, make_queue):
    orders = make_queue("order.*", name="orders", max_retries=3)
    message_id = pgmb.send("order.created", {"order": 11}, headers={"tenant": "acme"})
    [claimed] = deliveries.claim(["orders"], 1)
    deliveries.fail([deliveries.Failure(claimed.delivery_id, claimed.lease_id, 503, "busy")])
    delivery = Delivery.objects.get(message_id=message_id)

    page = admin_client.get(url("delivery_change", delivery.pk)).content.decode()

    assert f"{message_id} → orders" in page
    assert str(orders.id) not in page
    assert "&quot;order&quot;: 11" in page and "&quot;tenant&quot;: &quot;acme&quot;" in page
    timeline = page[page.index('class="pgmb-timeline"') :]
    assert re.findall(r"<tr><td>(\d+)</td><td>([^<]+)</td><td>(\d*)</td>", timeline) == [
        ("1", "will retry", "503")
    ]


def test_a_body_longer_than_a_page_shows_is_cut_and_says_so(admin_client, make_queue):
    make_queue("order.*", name="orders")
    message_id = pgmb.send("order.created", {"note": "y" * 70_000})
    delivery = Delivery.objects.get(message_id=message_id)

    for page_url in (url("delivery_change", delivery.pk), url("message_change", message_id)):
        page = admin_client.get(page_url).content.decode()
        assert "The first 65,536 of 70,012 characters, as stored." in page
        assert "y" * 65_000 in page and "y" * 70_000 not in page
