"""Faults at the boundaries, in the in-database loop with each transport (tests/faults.py)."""

from pgmb.models import Delivery
from tests.faults import check_faulty_world


def test_in_database_loop_records_every_fault_and_delivers_the_rest(
    faulty_world, transport, dispatch_until
):
    dispatch_until(lambda: not Delivery.objects.exists(), "deliveries are left", seconds=2.0)
    check_faulty_world(faulty_world)
