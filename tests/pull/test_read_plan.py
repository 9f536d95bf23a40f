"""pgmb.read plans its statement once per session, and that plan finds rows by key (0027)."""

from __future__ import annotations

from django.db import connection

import pgmb
from pgmb import pull
from tests.plans import plans_of


def _plans_of_reads(queue_name: str, reads: int) -> list[str]:
    """The plans of the update statements run by ``reads`` reads in a row."""

    def read() -> None:
        for _ in range(reads):
            pull.read(queue_name, 30, 10)

    return [plan for plan in plans_of(read) if "Update on pgmb_delivery" in plan]


def test_reads_use_one_generic_plan_that_finds_rows_by_key(make_pull_queue):
    queue = make_pull_queue()
    pgmb.send_batch(("k", {"n": n}) for n in range(3000))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgmb_delivery")
    # Past the five custom plans after which PostgreSQL weighs the generic one.
    plans = _plans_of_reads(queue.name, 7)
    assert len(plans) == 7
    for plan in plans:
        # Generic: the queue is a parameter, not the constant of a custom plan.
        assert "queue_id = $" in plan, plan
        # The picked rows are updated through the primary key, never a scan of the table.
        assert "Seq Scan on pgmb_delivery" not in plan, plan
        assert "pgmb_delivery_pkey" in plan, plan
        assert "pgmb_delivery_due" in plan, plan


def test_a_full_read_runs_its_statement_once_a_dead_lettering_twice(make_pull_queue):
    # The rows go straight from the statement to the caller: only a read that dead-lettered
    # something and came back short runs it again, for more.
    queue = make_pull_queue(max_retries=0)
    pgmb.send_batch(("k", {"n": n}) for n in range(5))
    assert len(_plans_of_reads(queue.name, 1)) == 1  # 5 of 10: short, nothing dead-lettered
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgmb_delivery SET available_at = now() - interval '1 hour' WHERE queue_id = %s",
            [queue.id],
        )
    pgmb.send_batch(("k", {"n": n}) for n in range(20))
    got: list[pull.Message] = []

    def read() -> None:
        got.extend(pull.read(queue.name, 30, 10))

    # The 5 read once already come first and are dead-lettered: 5 more are read in their place.
    plans = [plan for plan in plans_of(read) if "Update on pgmb_delivery" in plan]
    assert len(plans) == 2
    assert [m.read_ct for m in got] == [1] * 10
    assert len(_plans_of_reads(queue.name, 1)) == 1  # 10 of 10
