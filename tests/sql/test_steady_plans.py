"""The hot functions keep to their rows whatever pgmb_delivery's statistics say (0032).

pgmb_delivery empties and fills all the time, and a vacuum of the drained table can record
it as holding no rows over many pages. Planned against that, a claim read the whole queue
through the wrong index and sorted it, and acks joined their ids to the whole table. The
plans are read with auto_explain: every node over pgmb_delivery must handle about the rows
of the call, not the table's.
"""

from __future__ import annotations

import re

import pytest
from django.db import connection

import pgmb
from pgmb import deliveries, pull
from pgmb.deliveries import Failure, Success
from pgmb.models import Delivery, Queue
from tests.plans import plans_of

#: Rows in the table when the calls are planned, and rows per claim.
BACKLOG = 3000
CLAIM = 100
_NODE = re.compile(r"on pgmb_delivery .*actual rows=(\d+) loops=(\d+)")


def _most_rows_of_a_node(plans: list[str]) -> tuple[int, str]:
    """The most rows one plan node over pgmb_delivery handled, with its plan."""
    worst, where = 0, ""
    for plan in plans:
        for rows, loops in _NODE.findall(plan):
            if int(rows) * int(loops) > worst:
                worst, where = int(rows) * int(loops), plan
    return worst, where


def _send(n: int) -> None:
    pgmb.send_batch(("steady.k", {"n": i}) for i in range(n))


@pytest.mark.django_db(transaction=True)
def test_claims_and_outcomes_read_their_rows_when_the_statistics_say_empty(make_queue):
    make_queue("steady.#", max_retries=0)
    # Pages for the table, emptied, then a vacuum that keeps them: the statistics now say
    # that the table holds nothing over all those pages.
    _send(BACKLOG)
    while claimed := deliveries.claim(None, 1000):
        deliveries.ack([Success(c.delivery_id, 200) for c in claimed])
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (TRUNCATE false) pgmb_delivery")
        cursor.execute("SELECT reltuples, relpages FROM pg_class WHERE relname = 'pgmb_delivery'")
        reltuples, relpages = cursor.fetchone()
    assert reltuples == 0 and relpages > 10
    # Plans cached while the table looked empty, and held one row, must not be kept for the
    # backlog either.
    for _ in range(8):
        _send(1)
        (one,) = deliveries.claim(None, CLAIM)
        deliveries.start([one])
        deliveries.ack([Success(one.delivery_id, 200)])
    _send(1)
    (one,) = deliveries.claim(None, CLAIM)
    deliveries.fail([Failure(one.delivery_id, one.lease_id, 500, "no")])
    _send(BACKLOG)

    outcome: dict[str, int] = {}

    def work() -> None:
        claimed = deliveries.claim(None, CLAIM)
        outcome["claimed"] = len(claimed)
        outcome["started"] = deliveries.start(claimed)
        half = len(claimed) // 2
        outcome["acked"] = deliveries.ack([Success(c.delivery_id, 200) for c in claimed[:half]])
        outcome["failed"] = deliveries.fail(
            [Failure(c.delivery_id, c.lease_id, 500, "no") for c in claimed[half:]]
        )

    plans = plans_of(work, analyze=True)
    half = CLAIM // 2
    assert outcome == {"claimed": CLAIM, "started": CLAIM, "acked": half, "failed": half}
    assert plans, "auto_explain showed no plan"
    worst, where = _most_rows_of_a_node(plans)
    # The pick reads the claim's rows (and a few it skips); 2x leaves room, the table is 30x.
    assert worst <= 2 * CLAIM, f"a node over pgmb_delivery handled {worst} rows:\n{where}"
    # All the claimed messages left the table: acked, or dead after their one attempt.
    assert Delivery.objects.count() == BACKLOG - CLAIM


@pytest.mark.django_db(transaction=True)
def test_pull_reads_read_their_rows_when_the_statistics_say_empty():
    # pgmb.read and pgmb.settle_reads keep their cached plans, under the planner settings of
    # pgmb/sql/schema/pull.sql.
    Queue.objects.create(name="steady_pull", binding_key="steady.#", worker=None)
    _send(BACKLOG)
    while got := pull.read("steady_pull", 30, 1000):
        pull.delete("steady_pull", got)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (TRUNCATE false) pgmb_delivery")
    for _ in range(8):
        _send(1)
        (one,) = pull.read("steady_pull", 30, CLAIM)
        assert pull.delete("steady_pull", [one]) == [one.id]
    _send(BACKLOG)
    outcome: dict[str, int] = {}

    def work() -> None:
        got = pull.read("steady_pull", 30, CLAIM)
        outcome["read"] = len(got)
        outcome["deleted"] = len(pull.delete("steady_pull", got))

    plans = plans_of(work, analyze=True)
    assert outcome == {"read": CLAIM, "deleted": CLAIM}
    worst, where = _most_rows_of_a_node(plans)
    assert worst <= 2 * CLAIM, f"a node over pgmb_delivery handled {worst} rows:\n{where}"
