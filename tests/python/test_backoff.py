"""The waits between reconnection attempts stay between the first wait and the cap, so a
dispatcher is back at most one cap after the database accepts connections again."""

from pgmb.db.backoff import CAP, FIRST, Backoff


def test_waits_stay_within_first_and_cap_and_grow_towards_the_cap():
    backoff = Backoff()
    waits = [backoff.next() for _ in range(200)]
    assert all(FIRST <= w <= CAP for w in waits)
    assert max(waits) > CAP / 2  # it does back off, not hammer at the first wait
    assert CAP <= 0.5  # the reconnection promise of docs/operations: within a second


def test_reset_starts_the_next_outage_short():
    backoff = Backoff()
    for _ in range(50):
        backoff.next()
    backoff.reset()
    assert backoff.next() <= FIRST * 1.0000001


def test_waits_are_jittered():
    backoff = Backoff()
    waits = [backoff.next() for _ in range(50)]
    assert len(set(waits)) > 40
