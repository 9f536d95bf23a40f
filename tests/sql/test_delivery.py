"""The delivery state machine: claim, ack, fail/retry, dead letter, lease expiry, requeue,
purge, rate limits, through the typed API (pgmb.deliveries) that both dispatchers, the
commands and the admin use. Each call is one SQL function of schema pgmb."""

import asyncio
import json
import uuid

import psycopg
import pytest
from django.db import DataError, connection, transaction

import pgmb
from pgmb import deliveries
from pgmb.db.conninfo import conninfo_from_django
from pgmb.db.statements import arun
from pgmb.deliveries import Failure, Success
from pgmb.models import WORKER_RULED_COLUMNS, Attempt, DeadLetter, Delivery


@pytest.fixture
def claim(db):
    def run(queues=None, n=100) -> list[deliveries.Claimed]:
        return deliveries.claim(queues, n)

    return run


def _fail(sql, rows, status=500, error="boom", retry_after=None):
    return deliveries.fail(
        [Failure(r.delivery_id, r.lease_id, status, error, retry_after, 12.5) for r in rows]
    )


def _expire_leases(sql):
    sql(
        "UPDATE pgmb_delivery SET available_at = now() - interval '1 second' WHERE state = 'leased'"
    )


def _make_due(sql):
    sql("UPDATE pgmb_delivery SET available_at = now() - interval '1 second' WHERE state = 'ready'")


def test_claim_leases_due_deliveries_with_everything_a_post_needs(make_worker, make_queue, claim):
    worker = make_worker(rps=1000, secret="s3cret raw secret", endpoint="http://127.0.0.1:1/x")
    queue = make_queue("order.*", worker=worker, lease_seconds=30)
    mid = pgmb.send("order.created", {"n": 1}, headers={"h": "v"})
    pgmb.send("order.created", {"n": 2}, delay=3600)
    [row] = claim()
    assert row.message_id == str(mid)
    assert row.body == '{"n": 1}'
    assert json.loads(row.headers) == {"h": "v"}  # Django's cursor leaves jsonb as text
    assert (row.queue, row.routing_key, row.attempt) == (queue.name, "order.created", 1)
    assert (row.max_attempts, row.last_attempt) == (1 + queue.max_retries, False)
    assert (row.endpoint, row.secrets, row.rps) == (
        "http://127.0.0.1:1/x",
        ["s3cret raw secret"],
        1000,
    )
    assert (row.timeout, row.lease_seconds, row.worker_id) == (10.0, 30.0, str(worker.pk))
    delivery = Delivery.objects.get(pk=row.delivery_id)
    assert (delivery.state, delivery.attempts, delivery.lease_id) == ("leased", 1, row.lease_id)
    assert claim() == []  # leased and delayed deliveries are not due


def test_claim_respects_queue_names_pause_and_inactive_workers(make_worker, make_queue, claim):
    a = make_queue("a", name="qa")
    b = make_queue("b", name="qb")
    paused = make_queue("c", name="qc", paused=True)
    idle = make_queue("d", name="qd", worker=make_worker(active=False))
    for key in "abcd":
        pgmb.send(key, 1)
    assert {r.queue for r in claim(["qb", "qc", "qd"])} == {b.name}
    assert {r.queue for r in claim()} == {a.name}
    assert paused.deliveries.get().state == idle.deliveries.get().state == "ready"


def test_a_claims_token_refill_runs_no_worker_rules(make_worker, make_queue, claim):
    """The claim writes its worker's token bucket back; the worker's rules (the
    worker_validate triggers, pgmb.prepare_worker) run for any other change only
    (docs/decisions/0078-a-claim-plans-once-and-pays-no-worker-rules.md)."""
    worker = make_worker(rps=10)  # a bucket of 2 (burst 0.2 s)
    make_queue("order.*", worker=worker)
    for n in range(3):
        pgmb.send("order.created", {"n": n})
    rules = "pg_stat_get_xact_function_calls('pgmb.prepare_worker(pgmb_worker)'::regprocedure)"
    with connection.cursor() as cursor:
        cursor.execute("SET track_functions = 'all'")
        try:
            assert len(claim(n=2)) == 2
            cursor.execute(f"SELECT {rules}")
            assert cursor.fetchone() == (None,)
            cursor.execute(
                "SELECT tokens_at IS NOT NULL FROM pgmb_worker WHERE id = %s", [worker.pk]
            )
            assert cursor.fetchone() == (True,)  # the bucket was written back
            cursor.execute("UPDATE pgmb_worker SET rps = 20 WHERE id = %s", [worker.pk])
            cursor.execute(f"SELECT {rules}")
            assert cursor.fetchone() == (1,)
            with pytest.raises(DataError, match="invalid rps 0"), transaction.atomic():
                cursor.execute("UPDATE pgmb_worker SET rps = 0 WHERE id = %s", [worker.pk])
        finally:
            cursor.execute("RESET track_functions")


def test_every_worker_column_but_the_bucket_runs_the_rules(db):
    """The UPDATE trigger of the worker's rules lists every column of pgmb_worker but
    the token bucket's, so that a column added later is not left unchecked."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_trigger t"
            " JOIN pg_attribute a ON a.attrelid = t.tgrelid AND a.attnum = ANY (t.tgattr)"
            " WHERE t.tgrelid = 'pgmb_worker'::regclass"
            " AND t.tgname LIKE 'pgtrigger_worker_validate_update_%'"
        )
        (listed,) = cursor.fetchone()
        cursor.execute(
            "SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute"
            " WHERE attrelid = 'pgmb_worker'::regclass AND attnum > 0 AND NOT attisdropped"
            " AND attname NOT IN ('tokens', 'tokens_at')"
        )
        (columns,) = cursor.fetchone()
    assert listed == columns
    assert sorted(columns) == sorted(WORKER_RULED_COLUMNS)


def test_claim_is_fifo_within_a_queue(make_queue, claim):
    make_queue("#")
    ids = [str(pgmb.send("k", n)) for n in range(5)]
    assert [r.message_id for r in claim(n=3)] == ids[:3]
    assert [r.message_id for r in claim(n=3)] == ids[3:]


@pytest.fixture
def second_connection():
    """Another session, for what one transaction sees of another's locks."""
    conn = psycopg.connect(**connection.get_connection_params())
    yield conn
    conn.close()


@pytest.mark.django_db(transaction=True)
def test_claims_skip_deliveries_locked_by_another_claim(make_queue, second_connection):
    make_queue("#")
    pgmb.send_batch(("k", n) for n in range(200))
    # Another session holds 150 deliveries (as a claim in flight would).
    held = second_connection.execute(
        "SELECT id FROM pgmb_delivery ORDER BY id LIMIT 150 FOR UPDATE"
    ).fetchall()
    claimed = {c.delivery_id for c in deliveries.claim(None, 200)}
    second_connection.rollback()
    assert len(claimed) == 50
    assert not claimed & {r[0] for r in held}


@pytest.mark.django_db(transaction=True)
def test_claims_skip_a_worker_another_claim_is_serving(make_worker, make_queue, second_connection):
    make_queue("#", worker=make_worker(rps=1000, burst=1.0))
    pgmb.send_batch(("k", n) for n in range(10))
    busy = second_connection.execute("SELECT count(*) FROM pgmb.claim(NULL, 4)").fetchone()
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '2s'")
    assert deliveries.claim(None, 10) == []  # returned at once, without waiting for the lock
    second_connection.commit()
    assert len(deliveries.claim(None, 10)) == 6
    with connection.cursor() as cursor:
        cursor.execute("RESET lock_timeout")
    assert busy == (4,)


def test_token_bucket_caps_a_claim_and_refills(make_worker, make_queue, claim, sql):
    worker = make_worker(rps=10, burst=1.0)
    make_queue("#", worker=worker)
    pgmb.send_batch(("k", n) for n in range(50))
    assert len(claim(n=50)) == 10  # a full bucket is rps * burst tokens
    assert len(claim(n=50)) == 0
    sql("UPDATE pgmb_worker SET tokens_at = tokens_at - interval '0.5 second'")
    assert len(claim(n=50)) == 5
    sql("UPDATE pgmb_worker SET burst = 0.3, tokens_at = tokens_at - interval '1 hour'")
    assert len(claim(n=50)) == 3  # each worker's own burst sizes its bucket


def test_ack_removes_the_delivery_and_records_it(make_queue, claim, sql):
    queue = make_queue("#", name="order_queue")
    mid = pgmb.send("order.created", 1)
    [row] = claim()
    assert deliveries.ack([Success(row.delivery_id, 204, 3.5)]) == 1
    assert not Delivery.objects.exists()
    attempt = Attempt.objects.get()
    assert (attempt.message_id, attempt.queue_id, attempt.attempt) == (mid, queue.pk, 1)
    assert (attempt.outcome, attempt.status_code, attempt.duration_ms) == ("ack", 204, 3.5)
    assert sql("SELECT acknoledge, state FROM pgmb.order_queue") == [(True, "acked")]
    assert sql("SELECT count(*) FROM pgmb.order_queue WHERE acknoledge = false") == [(0,)]
    assert deliveries.ack([Success(row.delivery_id)]) == 0  # twice is harmless


def test_fail_retries_with_backoff_then_dead_letters(make_queue, claim, sql):
    queue = make_queue("#", name="order_queue", max_retries=2, backoff_base=10, backoff_max=15)
    mid = pgmb.send("k", {"n": 1})
    delays = []
    for attempt in (1, 2):
        [row] = claim()
        assert (row.attempt, row.last_attempt) == (attempt, False)
        assert _fail(sql, [row]) == 1
        # The retry's due time, counted from when the failure was recorded.
        [(delay,)] = sql(
            "SELECT extract(epoch FROM d.available_at - a.created_at) FROM pgmb_delivery d "
            "JOIN pgmb_attempt a ON a.message_id = d.message_id AND a.attempt = %s",
            (attempt,),
        )
        delays.append(float(delay))
        _make_due(sql)
    # equal jitter within [d/2, d]: d = 10 for attempt 1, min(15, 20) = 15 for attempt 2
    assert 5 - 0.01 <= delays[0] <= 10 + 0.01
    assert 7.5 - 0.01 <= delays[1] <= 15 + 0.01
    [row] = claim()
    assert (row.attempt, row.last_attempt) == (3, True)  # 1 + max_retries attempts in all
    assert _fail(sql, [row], status=503, error="unavailable") == 1
    assert not Delivery.objects.exists()
    dead = DeadLetter.objects.get()
    assert (dead.message_id, dead.queue_id, dead.attempts) == (mid, queue.pk, 3)
    assert (dead.last_status, dead.last_error) == (503, "unavailable")
    outcomes = list(Attempt.objects.order_by("attempt").values_list("attempt", "outcome"))
    assert outcomes == [(1, "retry"), (2, "retry"), (3, "dead")]
    assert sql("SELECT message_id, attempts FROM pgmb.order_dead_letter_queue") == [(mid, 3)]


def test_zero_retries_means_one_attempt(make_queue, claim, sql):
    make_queue("#", max_retries=0)
    pgmb.send("k", 1)
    _fail(sql, claim())
    assert DeadLetter.objects.count() == 1


def test_retry_after_is_honoured(make_queue, claim, sql):
    make_queue("#", backoff_base=1, backoff_max=2)
    pgmb.send("k", 1)
    _fail(sql, claim(), status=429, retry_after=120)
    [(delay,)] = sql(
        "SELECT extract(epoch FROM d.available_at - a.created_at) "
        "FROM pgmb_delivery d JOIN pgmb_attempt a USING (message_id)"
    )
    assert 120 - 0.01 <= float(delay) <= 120 + 0.01  # from when the 429 was recorded
    assert Delivery.objects.get().last_status == 429


def test_a_stale_lease_cannot_fail_a_new_claim(make_queue, claim, sql):
    make_queue("#", lease_seconds=60)
    pgmb.send("k", 1)
    [old] = claim()
    _expire_leases(sql)
    assert deliveries.reclaim_expired() == 1
    _make_due(sql)
    [new] = claim()
    assert new.lease_id != old.lease_id
    assert _fail(sql, [old]) == 0
    assert Delivery.objects.get().state == "leased"


def test_expired_leases_count_as_failed_attempts(make_queue, claim, sql):
    make_queue("#", max_retries=1, backoff_base=0, backoff_max=0)
    pgmb.send("k", 1)
    assert deliveries.start(claim()) == 1  # its request started (tests/sql/test_start.py)
    _expire_leases(sql)
    assert deliveries.reclaim_expired() == 1
    delivery = Delivery.objects.get()
    assert (delivery.state, delivery.attempts) == ("ready", 1)
    deliveries.start(claim())
    _expire_leases(sql)
    deliveries.reclaim_expired()
    assert not Delivery.objects.exists()
    assert DeadLetter.objects.get().last_error.startswith("lease expired")
    assert list(Attempt.objects.order_by("attempt").values_list("outcome", flat=True)) == [
        "expired",
        "dead",
    ]


def test_requeue_brings_dead_letters_back(make_queue, claim, sql):
    queue = make_queue("#", name="jobs", max_retries=0)
    pgmb.send_batch(("k", n) for n in range(3))
    _fail(sql, claim())
    assert DeadLetter.objects.count() == 3
    one = DeadLetter.objects.order_by("id").first()
    assert deliveries.requeue(one.pk) == 1
    assert deliveries.requeue_queue("jobs") == 2
    assert deliveries.requeue_queue("jobs") == 0
    assert not DeadLetter.objects.exists()
    rows = claim()
    assert len(rows) == 3
    assert {r.attempt for r in rows} == {1}
    assert queue.deliveries.count() == 3


def test_purge_deletes_dead_letters_and_keeps_their_history(make_queue, claim, sql):
    make_queue("#", name="jobs", max_retries=0)
    other = make_queue("#", name="other", max_retries=0)
    pgmb.send_batch(("k", n) for n in range(3))
    _fail(sql, claim())
    assert DeadLetter.objects.count() == 6
    first, second = DeadLetter.objects.filter(queue__name="jobs").order_by("id")[:2]
    assert deliveries.purge_dead_letters([first.pk, second.pk]) == 2
    assert deliveries.purge_dead_letters(first.pk) == 0
    assert deliveries.purge_queue_dead_letters("jobs") == 1
    assert list(DeadLetter.objects.values_list("queue", flat=True)) == [other.pk] * 3
    assert Attempt.objects.filter(outcome="dead").count() == 6


def test_next_wakeup(make_queue, claim, sql):
    make_queue("#", name="w1", lease_seconds=300)
    assert deliveries.next_wakeup() is None
    assert deliveries.busy() is False
    pgmb.send("k", 1, delay=3600)
    seconds = deliveries.next_wakeup()
    # The time left until the delivery is due, whenever the machine gets to ask.
    [(left,)] = sql(
        "SELECT extract(epoch FROM available_at - clock_timestamp()) FROM pgmb_delivery"
    )
    assert float(left) - 0.01 <= seconds <= 3600  # asked before `left` was
    assert deliveries.busy() is False  # delayed by its producer: nothing to wait for
    pgmb.send("k", 2)
    assert deliveries.next_wakeup(["w1"]) == 0.0
    assert deliveries.busy(["w1"]) is True
    assert deliveries.next_wakeup(["other"]) is None


def test_claim_ack_fail_query_counts(
    make_worker, make_queue, claim, sql, django_assert_num_queries
):
    make_queue("#", worker=make_worker(rps=1000))
    pgmb.send_batch(("k", n) for n in range(20))
    with django_assert_num_queries(1):
        rows = claim(n=20)
    with django_assert_num_queries(1):
        deliveries.ack([Success(r.delivery_id) for r in rows[:10]])
    with django_assert_num_queries(1):
        _fail(sql, rows[10:])
    with django_assert_num_queries(1):
        assert deliveries.release(rows) == 0  # acked or failed: nothing left to release
    assert Attempt.objects.count() == 20


@pytest.mark.django_db(transaction=True)
def test_the_calls_run_the_same_transitions_on_an_async_connection(make_queue):
    """The external dispatcher runs the state machine's calls with arun, on psycopg's
    AsyncConnection."""
    make_queue("#", max_retries=0)
    pgmb.send_batch(("k", n) for n in range(3))

    async def transitions() -> list[deliveries.Claimed]:
        info = conninfo_from_django("default")
        async with await psycopg.AsyncConnection.connect(**info, autocommit=True) as conn:
            claims = await arun(conn, deliveries.claim_call(None, 10))
            first, second, third = claims
            success = Success(first.delivery_id, 200, 1.5)
            assert await arun(conn, deliveries.ack_call([success])) == 1
            failure = Failure(second.delivery_id, second.lease_id, 500, "down")
            assert await arun(conn, deliveries.fail_call([failure])) == 1
            assert await arun(conn, deliveries.release_call([third])) == 1
            assert await arun(conn, deliveries.reclaim_expired_call()) == 0
            return claims

    claims = asyncio.run(transitions())
    assert len(claims) == 3
    outcomes = dict(Attempt.objects.values_list("message_id", "outcome"))
    assert outcomes == {
        uuid.UUID(claims[0].message_id): "ack",
        uuid.UUID(claims[1].message_id): "dead",
    }
    released = Delivery.objects.get()
    assert (released.state, released.attempts) == ("ready", 0)
