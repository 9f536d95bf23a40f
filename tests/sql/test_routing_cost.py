"""What the routing trigger costs a publish (decision 0073): its pgtrigger.ignore() check
(pgmb/trigger_guard.py) free while nothing is ignored, pgtrigger.ignore() still skipping
it; pgmb_queue analyzed after any change, so that a few queues are scanned."""

from __future__ import annotations

import pgtrigger
import pytest
from django.db import connection

from pgmb.models import Delivery, Message
from tests.plans import plans_of

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


def test_the_queue_table_is_analyzed_after_any_change(db):
    """autovacuum analyzes a table once more rows changed than threshold + scale x rows."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = 'pgmb_queue'::regclass")
        (options,) = cursor.fetchone()
    assert "autovacuum_analyze_threshold=0" in options
    assert "autovacuum_analyze_scale_factor=0" in options


# Committed queues: autovacuum analyzes pgmb_queue after every change (threshold 0), and an
# ANALYZE of its own that ran after the test's would not see queues still uncommitted.
@pytest.mark.django_db(transaction=True)
def test_a_few_analyzed_queues_are_scanned_not_looked_up(make_queue):
    queues = [make_queue(binding) for binding in ("order.*", "invoice.#", "user.*.deleted")]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgmb_queue")  # as autovacuum does after the change
    plans = plans_of(_publish)
    routing = [plan for plan in plans if "INSERT INTO pgmb_delivery" in plan]
    assert routing and "Seq Scan on pgmb_queue" in routing[0], plans
    assert "Index Scan on pgmb_queue_binding_tags" not in routing[0]
    assert Delivery.objects.filter(queue=queues[0]).count() == 1
