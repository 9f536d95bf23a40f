"""A cap on requests in flight (Worker.max_in_flight): refused below 1 by every writer,
held by the claim that both dispatch paths share (a capped worker's unexpired leases are
its requests in flight), waited for by pgmb.next_wakeup, and paid for by capped workers
only (docs/decisions/0081-a-cap-on-requests-in-flight.md)."""

import os

import psycopg
import pytest
from django.db import DataError, connection, transaction

import pgmb
from pgmb import deliveries
from pgmb.db.conninfo import conninfo_from_django
from pgmb.deliveries import Success
from pgmb.models import Delivery, Worker

INVALID_VALUE = "22023"


@pytest.mark.parametrize("cap", [0, -1])
def test_a_cap_below_one_is_refused_by_sql_and_nothing_changes(sql, raises_sql, make_worker, cap):
    worker = make_worker("capped", max_in_flight=3)
    with raises_sql(INVALID_VALUE, f"invalid max_in_flight {cap} for worker capped"):
        sql("UPDATE pgmb_worker SET max_in_flight = %s WHERE id = %s", (cap, worker.pk))
    with raises_sql(INVALID_VALUE, f"invalid max_in_flight {cap} for worker other"):
        sql(
            "INSERT INTO pgmb_worker (name, endpoint, rps, timeout, burst, max_in_flight)"
            " VALUES ('other', 'http://127.0.0.1/', 10, 5, 0.2, %s)",
            (cap,),
        )
    assert list(Worker.objects.values_list("name", "max_in_flight")) == [("capped", 3)]


def test_the_orm_is_refused_as_well(make_worker):
    worker = make_worker("capped")
    with pytest.raises(DataError, match="invalid max_in_flight 0"), transaction.atomic():
        Worker.objects.filter(pk=worker.pk).update(max_in_flight=0)
    worker.refresh_from_db()
    assert worker.max_in_flight is None


def _leased() -> int:
    return Delivery.objects.filter(state="leased").count()


def test_the_claim_leases_no_more_than_the_cap(sql, make_worker, make_queue):
    worker = make_worker(max_in_flight=2)
    # Two queues of the worker: the cap is the worker's, not each queue's.
    make_queue("a.#", worker=worker)
    make_queue("b.#", worker=worker)
    pgmb.send_batch(("a.x" if n % 2 else "b.x", n) for n in range(6))

    first = deliveries.claim(None, 10)
    assert len(first) == 2
    assert deliveries.claim(None, 10) == []  # full
    # An outcome frees its slot: one more.
    deliveries.ack([Success(first[0].delivery_id, 200, 1.0)])
    second = deliveries.claim(None, 10)
    assert len(second) == 1 and _leased() == 2
    # A lease that ran out (its dispatcher crashed) frees its slot, reclaimed or not.
    sql(
        "UPDATE pgmb_delivery SET available_at = clock_timestamp() - interval '1 second'"
        " WHERE id = %s",
        (first[1].delivery_id,),
    )
    assert len(deliveries.claim(None, 10)) == 1
    # Raised, then lifted: the rest.
    Worker.objects.filter(pk=worker.pk).update(max_in_flight=3)
    assert len(deliveries.claim(None, 10)) == 1
    Worker.objects.filter(pk=worker.pk).update(max_in_flight=None)
    assert len(deliveries.claim(None, 10)) == 1  # the last one: 6 claimed, 1 acked
    assert Delivery.objects.filter(state="ready").count() == 0


def test_a_capped_workers_leases_do_not_hold_back_another_worker(make_worker, make_queue):
    make_queue("capped.#", worker=make_worker(max_in_flight=1))
    make_queue("free.#", worker=make_worker())
    pgmb.send_batch([("capped.x", 1), ("capped.x", 2), ("free.x", 3), ("free.x", 4)])
    assert sorted(r.routing_key for r in deliveries.claim(None, 10)) == [
        "capped.x",
        "free.x",
        "free.x",
    ]


def test_next_wakeup_waits_for_a_full_workers_first_lease(sql, make_worker, make_queue):
    worker = make_worker(max_in_flight=1)
    make_queue("#", worker=worker, lease_seconds=600)
    pgmb.send_batch(("k", n) for n in range(2))
    assert deliveries.next_wakeup(None) == 0  # due, a slot free
    [row] = deliveries.claim(None, 10)
    # Full: not 0 (a dispatcher would claim in a loop), but the lease's end.
    wake_in = deliveries.next_wakeup(None)
    assert 590 < wake_in <= 600
    Worker.objects.filter(pk=worker.pk).update(max_in_flight=None)
    assert deliveries.next_wakeup(None) == 0
    Worker.objects.filter(pk=worker.pk).update(max_in_flight=1)
    deliveries.ack([Success(row.delivery_id, 200, 1.0)])
    assert deliveries.next_wakeup(None) == 0


def _calls(function: str) -> int:
    """Calls of a PL/pgSQL function of schema pgmb counted so far (the backend's counts not
    yet flushed to the statistics: they outlive a rolled-back transaction)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(pg_stat_get_xact_function_calls(%s::regprocedure), 0)", (function,)
        )
        return cursor.fetchone()[0]


FREE_SLOTS = "pgmb.free_slots(uuid, integer, timestamptz)"
SLOT_FREE_AT = "pgmb.slot_free_at(uuid, integer)"


def test_only_a_capped_worker_counts_its_leases(sql, make_worker, make_queue):
    """An uncapped worker's claim and wake-up run no count (the claim's one added step is a
    test of the worker's column, read with its row); a capped worker's run one each."""
    make_queue("free.#", name="free", worker=make_worker())
    make_queue("capped.#", name="capped", worker=make_worker(max_in_flight=1))
    pgmb.send_batch(("free.x", n) for n in range(3))
    pgmb.send_batch(("capped.x", n) for n in range(2))
    sql("SET LOCAL track_functions = 'pl'")
    try:
        before = (_calls(FREE_SLOTS), _calls(SLOT_FREE_AT))

        def counted() -> tuple[int, int]:
            return (_calls(FREE_SLOTS) - before[0], _calls(SLOT_FREE_AT) - before[1])

        assert len(deliveries.claim(["free"], 2)) == 2
        assert deliveries.next_wakeup(["free"]) == 0
        assert counted() == (0, 0)

        assert len(deliveries.claim(["capped"], 10)) == 1
        assert counted() == (1, 0)
        # One still due: the wake-up asks when the worker has a slot again.
        assert deliveries.next_wakeup(["capped"]) > 0
        assert counted() == (2, 1)
    finally:
        # What was counted here is flushed once the test's transaction ends, not left for
        # the next test on this connection to read (PostgreSQL 15 and later: 14 sends a
        # transaction's counts to its statistics collector when it ends).
        if connection.pg_version >= 150000:
            sql("SELECT pg_stat_force_next_flush()")


def _woken_by_ack(cap: int | None, make_worker, make_queue) -> bool:
    """Whether acknowledging a worker's delivery wakes a waiting dispatcher: each session
    its own autocommit connection (a NOTIFY is delivered at commit); a marker notification
    sent after the ack tells when to stop listening."""
    make_queue("#", worker=make_worker(max_in_flight=cap))
    pgmb.send("k", 1)
    with (
        psycopg.connect(**conninfo_from_django("default"), autocommit=True) as listener,
        psycopg.connect(**conninfo_from_django("default"), autocommit=True) as dispatcher,
    ):
        listener.execute("LISTEN pgmb")
        (me,) = dispatcher.execute(
            "SELECT pgmb.dispatcher_start('external', 'test', %s)", [os.getpid()]
        ).fetchone()
        [(delivery_id,)] = dispatcher.execute("SELECT delivery_id FROM pgmb.claim()").fetchall()
        assert dispatcher.execute("SELECT pgmb.dispatcher_idle(%s)", [me]).fetchone() == (True,)
        dispatcher.execute("SELECT pgmb.ack(ARRAY[%s]::bigint[])", [delivery_id])
        dispatcher.execute("NOTIFY pgmb, 'marker'")
        payloads = []
        for note in listener.notifies(timeout=60):
            if note.payload == "marker":
                break
            payloads.append(note.payload)
    assert not Delivery.objects.exists()
    return payloads == [""]


def test_an_ack_of_a_capped_workers_delivery_wakes_waiting_dispatchers(
    transactional_db, make_worker, make_queue
):
    assert _woken_by_ack(2, make_worker, make_queue)


def test_an_ack_of_an_uncapped_workers_delivery_wakes_nobody(
    transactional_db, make_worker, make_queue
):
    assert not _woken_by_ack(None, make_worker, make_queue)
