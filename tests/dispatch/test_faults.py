"""Faults at the boundaries, in the external dispatcher (see tests/faults.py)."""

from tests.faults import NORMAL, check_faulty_world


def test_external_dispatcher_records_every_fault_and_delivers_the_rest(faulty_world, dispatch):
    stats = dispatch(concurrency=8, batch=10)
    assert stats.delivered == NORMAL
    assert stats.failed == faulty_world["queues"] * (NORMAL + 1) - NORMAL
    check_faulty_world(faulty_world)
