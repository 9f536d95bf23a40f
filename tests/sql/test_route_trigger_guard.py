"""The routing trigger's pgtrigger.ignore() check (pgmb/trigger_guard.py, decision 0073):
free while nothing is ignored, and pgtrigger.ignore() still skips the trigger."""

from __future__ import annotations

import pgtrigger
import pytest
from django.db import connection

from pgmb.models import Delivery, Message

IGNORE_CHECK = "public._pgtrigger_should_ignore(name)"


def _publish(key: str = "order.created") -> Message:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgmb_message (routing_key, body) VALUES (%s, '{}') RETURNING id", [key]
        )
        return Message.objects.get(id=cursor.fetchone()[0])


def _ignore_checks() -> int:
    """Calls of pgtrigger's ignore function in this transaction (track_functions on)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(pg_stat_get_xact_function_calls(%s::regprocedure), 0)",
            [IGNORE_CHECK],
        )
        return cursor.fetchone()[0]


@pytest.fixture
def tracked(db):
    with connection.cursor() as cursor:
        cursor.execute("SET track_functions = 'all'")
    yield
    with connection.cursor() as cursor:
        cursor.execute("RESET track_functions")


def test_a_publish_with_nothing_ignored_never_calls_the_ignore_function(make_queue, tracked):
    queue = make_queue("order.*")
    before = _ignore_checks()  # the queue's and its worker's triggers, not guarded
    for n in range(3):
        message = _publish()
        assert Delivery.objects.filter(message=message, queue=queue).count() == 1, n
    with connection.cursor() as cursor:
        # An empty list, as pgtrigger leaves the setting after an ignore() ends.
        cursor.execute("SELECT set_config('pgtrigger.ignore', '{}', true)")
    message = _publish()
    assert Delivery.objects.filter(message=message, queue=queue).count() == 1
    assert _ignore_checks() == before


def test_ignoring_the_routing_trigger_still_skips_it(make_queue, tracked):
    queue = make_queue("order.*")
    before = _ignore_checks()
    with pgtrigger.ignore("pgmb.Message:route_messages"):
        skipped = _publish()
    assert Message.objects.filter(id=skipped.id).exists()
    assert not Delivery.objects.filter(message=skipped).exists()
    # Asked of pgtrigger's function, which said "ignore".
    assert _ignore_checks() == before + 1
    routed = _publish()
    assert Delivery.objects.filter(message=routed, queue=queue).count() == 1


def test_ignoring_another_trigger_routes_as_usual(make_queue, tracked):
    queue = make_queue("order.*")
    before = _ignore_checks()
    with pgtrigger.ignore("pgmb.Delivery:hold_delivery"):
        message = _publish()
    assert Delivery.objects.filter(message=message, queue=queue).count() == 1
    # Something was ignored: pgtrigger's function decided, and said "route".
    assert _ignore_checks() == before + 1
