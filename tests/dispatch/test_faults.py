"""Faults at the boundaries, in the external dispatcher (see tests/faults.py)."""

import pgmb
from tests.faults import NORMAL, REFUSALS, check_faulty_world


def test_external_dispatcher_records_every_fault_and_delivers_the_rest(faulty_world, dispatch):
    stats = dispatch(concurrency=8, batch=10)
    assert stats.delivered == NORMAL
    assert stats.failed == faulty_world["queues"] * (NORMAL + 1) - NORMAL
    check_faulty_world(faulty_world)


def test_a_refused_claim_is_logged_and_tried_again(
    claims_refused, dispatch, recording_server, make_worker, make_queue, caplog
):
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    ids = pgmb.send_batch(("k", n) for n in range(5))
    with caplog.at_level("ERROR", logger="pgmb.dispatch"):
        stats = dispatch()
    assert stats.delivered == 5
    assert {r.headers["pgmb-message-id"] for r in recording_server.requests} == set(map(str, ids))
    refused = [r for r in caplog.records if "refused a state-machine call" in r.getMessage()]
    assert len(refused) == REFUSALS
    assert "refused by the test" in refused[0].getMessage()
