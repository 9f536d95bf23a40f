"""Faults at the boundaries, in the in-database loop with each transport (tests/faults.py)."""

from django.db import connection

import pgmb
from pgmb.models import Delivery
from tests.faults import REFUSALS, check_faulty_world


def test_in_database_loop_records_every_fault_and_delivers_the_rest(
    faulty_world, transport, dispatch_until
):
    dispatch_until(lambda: not Delivery.objects.exists(), "deliveries are left", seconds=2.0)
    check_faulty_world(faulty_world)


def test_the_loop_survives_a_refused_claim(
    claims_refused, dispatch_until, recording_server, make_worker, make_queue
):
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    ids = pgmb.send_batch(("k", n) for n in range(5))
    # One CALL: the claims refused first end neither the call nor the deliveries.
    dispatch_until(lambda: not Delivery.objects.exists(), "deliveries are left", seconds=3.0)
    assert {r.headers["pgmb-message-id"] for r in recording_server.requests} == set(map(str, ids))
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval('pgmb_test_refusals')")
        assert cursor.fetchone()[0] > REFUSALS + 1  # the refusals did happen
