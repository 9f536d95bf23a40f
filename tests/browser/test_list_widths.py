"""Every list of the admin fits a 1,280 pixel screen: no column is cut and no list scrolls
sideways inside its box, with long names and errors as production has them. Measured with
the admin's navigation sidebar closed, as the other browser tests are (open, it leaves the
lists 276 pixels less: docs/console.md)."""

from __future__ import annotations

import pytest
from django.utils import timezone

import pgmb
from pgmb import deliveries
from pgmb.models import Delivery

from .conftest import log_in, screenshot

pytestmark = pytest.mark.browser

# The dispatcher list is tested with running dispatchers in tests/admin/test_dispatchers.py.
LISTS = ["queue", "worker", "deadletter", "delivery", "message", "attempt"]


@pytest.fixture
def busy(make_worker, make_queue):
    """Names and errors as long as production's: two failed deliveries (one dead), one ready."""
    worker = make_worker(
        name="fulfilment_service_eu_west",
        endpoint="https://fulfilment.eu-west-1.internal.example.com/hooks/pgmb/orders",
    )
    queue = make_queue(
        "order.*.created", name="fulfilment_orders_created", worker=worker, max_retries=1
    )
    for n in range(3):
        message_id = pgmb.send("order.eu.created", {"n": n}, headers={"tenant": "acme-industries"})
        Delivery.objects.filter(message_id=message_id).update(available_at=timezone.now())
    error = (
        "HTTP 503: upstream connect error or disconnect/reset before headers. "
        "reset reason: connection termination"
    )
    for _ in range(2):
        Delivery.objects.update(available_at=timezone.now())
        for claimed in deliveries.claim([queue.name], 1):
            deliveries.fail(
                [
                    deliveries.Failure(
                        claimed.delivery_id, claimed.lease_id, 503, error, None, 30_012.5
                    )
                ]
            )


@pytest.mark.parametrize("name", LISTS)
def test_the_list_fits_a_1280_pixel_screen(page, operator, busy, name):
    log_in(page, operator, f"/admin/pgmb/{name}/")
    page.wait_for_url(f"**/admin/pgmb/{name}/")

    scroll, box = page.evaluate(
        "() => { const r = document.querySelector('#changelist .results');"
        " return [r.scrollWidth, r.clientWidth]; }"
    )

    if scroll > box:
        screenshot(page, f"list-{name}-too-wide")
    assert scroll <= box, f"the {name} list is {scroll} px wide in a box of {box}"
