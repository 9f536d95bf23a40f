"""The message options in the admin (read-only): a message's page, a delivery's page, and
the delivery list and its status filter."""

from __future__ import annotations

import pgmb
from pgmb.models import Delivery

from .conftest import table_rows, url


def test_message_page_and_delivery_list_show_the_options(admin_client, make_queue):
    queue = make_queue("#", name="orders")
    head = pgmb.send("k", 1, group="order-42", priority=-3, max_retries=2, retry_delay=30)
    behind = pgmb.send("k", 2, group="order-42", dedup_id="d-1")

    page = admin_client.get(url("message_change", behind)).content.decode()
    assert "order-42" in page and "d-1" in page
    page = admin_client.get(url("message_change", head)).content.decode()
    assert "-3" in page and "30.0" in page

    rows = table_rows(admin_client.get(url("delivery_changelist")))
    assert len(rows) == 2
    # The group and priority are on a delivery's page (the list has no room for them).
    head_delivery = Delivery.objects.get(message_id=head)
    page = admin_client.get(url("delivery_change", head_delivery.pk)).content.decode()
    assert "order-42" in page and "-3" in page
    [waiting] = table_rows(admin_client.get(url("delivery_changelist"), {"status": "waiting"}))
    assert str(behind) in waiting and ">waiting<" in waiting
    [ready] = table_rows(admin_client.get(url("delivery_changelist"), {"status": "ready"}))
    assert str(head) in ready
    by_queue = admin_client.get(url("delivery_changelist"), {"queue__id__exact": str(queue.pk)})
    assert len(table_rows(by_queue)) == 2
