"""A delivery's unique key on its page and its message's (read-only): docs/publishing.md,
Unique while live."""

import pytest

import pgmb
from pgmb.models import Delivery

from .conftest import url

pytestmark = pytest.mark.django_db


def test_the_key_is_shown_and_cannot_be_edited(admin_client, make_queue):
    make_queue("order.*")
    sent = pgmb.send("order.placed", {"n": 1}, unique_key="order-42", on_duplicate="replace")
    delivery = Delivery.objects.get(message_id=sent)
    page = admin_client.get(url("delivery_change", delivery.pk)).content.decode()
    assert "field-unique_key" in page and "order-42" in page
    assert 'name="unique_key"' not in page
    page = admin_client.get(url("message_change", sent)).content.decode()
    assert "field-unique_key" in page and "order-42" in page
    assert "field-on_duplicate" in page and 'name="on_duplicate"' not in page
