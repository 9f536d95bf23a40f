"""The delivery state machine in SQL: claim, ack, fail/retry, dead letter, lease expiry,
requeue, rate limits. Both dispatchers call exactly these functions."""

import json
import uuid

import psycopg
import pytest
from django.db import connection

import pgmb
from pgmb.models import Attempt, DeadLetter, Delivery

CLAIM_COLUMNS = (
    "delivery_id, lease_id, attempt, queue_id, queue, message_id, routing_key, body, headers,"
    " created_at, worker_id, endpoint, timeout, secret, rps"
)


@pytest.fixture
def claim(sql):
    def run(queues=None, n=100, burst=1.0) -> list[dict]:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {CLAIM_COLUMNS} FROM pgmb.claim(%s, %s, %s)", (queues, n, burst)
            )
            names = [c.name for c in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    return run


def _fail(sql, rows, status=500, error="boom", retry_after=None):
    return sql(
        "SELECT pgmb.fail(%s, %s, %s, %s, %s, %s)",
        (
            [r["delivery_id"] for r in rows],
            [r["lease_id"] for r in rows],
            [status] * len(rows),
            [error] * len(rows),
            [retry_after] * len(rows),
            [12.5] * len(rows),
        ),
    )[0][0]


def _expire_leases(sql):
    sql(
        "UPDATE pgmb_delivery SET available_at = now() - interval '1 second' WHERE state = 'leased'"
    )


def _make_due(sql):
    sql("UPDATE pgmb_delivery SET available_at = now() - interval '1 second' WHERE state = 'ready'")


def test_claim_leases_due_deliveries_with_everything_a_post_needs(make_worker, make_queue, claim):
    worker = make_worker(rps=1000, secret="s3cret", endpoint="http://127.0.0.1:1/x")
    queue = make_queue("order.*", worker=worker, lease_seconds=30)
    mid = pgmb.send("order.created", {"n": 1}, headers={"h": "v"})
    pgmb.send("order.created", {"n": 2}, delay=3600)
    [row] = claim()
    assert row["message_id"] == mid
    assert row["body"] == '{"n": 1}'
    assert json.loads(row["headers"]) == {"h": "v"}  # Django's cursor leaves jsonb as text
    assert (row["queue"], row["routing_key"], row["attempt"]) == (queue.name, "order.created", 1)
    assert (row["endpoint"], row["secret"], row["rps"]) == ("http://127.0.0.1:1/x", "s3cret", 1000)
    delivery = Delivery.objects.get(pk=row["delivery_id"])
    assert (delivery.state, delivery.attempts, delivery.lease_id) == ("leased", 1, row["lease_id"])
    assert claim() == []  # leased and delayed deliveries are not due


def test_claim_respects_queue_names_pause_and_inactive_workers(make_worker, make_queue, claim):
    a = make_queue("a", name="qa")
    b = make_queue("b", name="qb")
    paused = make_queue("c", name="qc", paused=True)
    idle = make_queue("d", name="qd", worker=make_worker(active=False))
    for key in "abcd":
        pgmb.send(key, 1)
    assert {r["queue"] for r in claim(["qb", "qc", "qd"])} == {b.name}
    assert {r["queue"] for r in claim()} == {a.name}
    assert paused.deliveries.get().state == idle.deliveries.get().state == "ready"


def test_claim_is_fifo_within_a_queue(make_queue, claim):
    make_queue("#")
    ids = [pgmb.send("k", n) for n in range(5)]
    assert [r["message_id"] for r in claim(n=3)] == ids[:3]
    assert [r["message_id"] for r in claim(n=3)] == ids[3:]


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
    with connection.cursor() as cursor:
        cursor.execute("SELECT delivery_id FROM pgmb.claim(NULL, 200, 1000)")
        claimed = {r[0] for r in cursor.fetchall()}
    second_connection.rollback()
    assert len(claimed) == 50
    assert not claimed & {r[0] for r in held}


@pytest.mark.django_db(transaction=True)
def test_claims_skip_a_worker_another_claim_is_serving(make_queue, second_connection):
    make_queue("#")
    pgmb.send_batch(("k", n) for n in range(10))
    busy = second_connection.execute("SELECT count(*) FROM pgmb.claim(NULL, 4, 1000)").fetchone()
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '2s'")
        cursor.execute("SELECT count(*) FROM pgmb.claim(NULL, 10, 1000)")
        assert cursor.fetchone() == (0,)  # returned at once, without waiting for the lock
        second_connection.commit()
        cursor.execute("SELECT count(*) FROM pgmb.claim(NULL, 10, 1000)")
        assert cursor.fetchone() == (6,)
        cursor.execute("RESET lock_timeout")
    assert busy == (4,)


def test_token_bucket_caps_a_claim_and_refills(make_worker, make_queue, claim, sql):
    worker = make_worker(rps=10)
    make_queue("#", worker=worker)
    pgmb.send_batch(("k", n) for n in range(50))
    assert len(claim(n=50, burst=1.0)) == 10  # a full bucket is rps * burst tokens
    assert len(claim(n=50, burst=1.0)) == 0
    sql("UPDATE pgmb_worker SET tokens_at = tokens_at - interval '0.5 second'")
    assert len(claim(n=50, burst=1.0)) == 5


def test_ack_removes_the_delivery_and_records_it(make_queue, claim, sql):
    queue = make_queue("#", name="order_queue")
    mid = pgmb.send("order.created", 1)
    [row] = claim()
    assert sql("SELECT pgmb.ack(%s, %s, %s)", ([row["delivery_id"]], [204], [3.5])) == [(1,)]
    assert not Delivery.objects.exists()
    attempt = Attempt.objects.get()
    assert (attempt.message_id, attempt.queue_id, attempt.attempt) == (mid, queue.pk, 1)
    assert (attempt.outcome, attempt.status_code, attempt.duration_ms) == ("ack", 204, 3.5)
    assert sql("SELECT acknoledge, state FROM pgmb.order_queue") == [(True, "acked")]
    assert sql("SELECT count(*) FROM pgmb.order_queue WHERE acknoledge = false") == [(0,)]
    assert sql("SELECT pgmb.ack(%s)", ([row["delivery_id"]],)) == [(0,)]  # twice is harmless


def test_fail_retries_with_backoff_then_dead_letters(make_queue, claim, sql):
    queue = make_queue("#", name="order_queue", max_retries=2, backoff_base=10, backoff_max=15)
    mid = pgmb.send("k", {"n": 1})
    delays = []
    for attempt in (1, 2):
        [row] = claim()
        assert row["attempt"] == attempt
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
    assert row["attempt"] == 3  # 1 + max_retries attempts in all
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
    assert sql("SELECT pgmb.reclaim_expired()") == [(1,)]
    _make_due(sql)
    [new] = claim()
    assert new["lease_id"] != old["lease_id"]
    assert _fail(sql, [old]) == 0
    assert Delivery.objects.get().state == "leased"


def test_expired_leases_count_as_failed_attempts(make_queue, claim, sql):
    make_queue("#", max_retries=1, backoff_base=0, backoff_max=0)
    pgmb.send("k", 1)
    claim()
    _expire_leases(sql)
    assert sql("SELECT pgmb.reclaim_expired()") == [(1,)]
    delivery = Delivery.objects.get()
    assert (delivery.state, delivery.attempts) == ("ready", 1)
    claim()
    _expire_leases(sql)
    sql("SELECT pgmb.reclaim_expired()")
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
    assert sql("SELECT pgmb.requeue(%s)", ([one.pk],)) == [(1,)]
    assert sql("SELECT pgmb.requeue('jobs')") == [(2,)]
    assert not DeadLetter.objects.exists()
    rows = claim()
    assert len(rows) == 3
    assert {r["attempt"] for r in rows} == {1}
    assert queue.deliveries.count() == 3


def test_next_wakeup(make_queue, claim, sql):
    make_queue("#", name="w1", lease_seconds=300)
    assert sql("SELECT pgmb.next_wakeup(NULL)") == [(None,)]
    pgmb.send("k", 1, delay=30)
    # The time left until the delivery is due, whenever the machine gets to ask.
    [(seconds, left)] = sql(
        "SELECT pgmb.next_wakeup(NULL), extract(epoch FROM available_at - clock_timestamp())"
        " FROM pgmb_delivery"
    )
    assert 0 < seconds <= 30
    assert float(left) - 0.01 <= seconds <= float(left) + 0.01
    pgmb.send("k", 2)
    assert sql("SELECT pgmb.next_wakeup(ARRAY['w1'])") == [(0.0,)]
    assert sql("SELECT pgmb.next_wakeup(ARRAY['other'])") == [(None,)]


def test_claim_ack_fail_query_counts(
    make_worker, make_queue, claim, sql, django_assert_num_queries
):
    make_queue("#", worker=make_worker(rps=1000))
    pgmb.send_batch(("k", n) for n in range(20))
    with django_assert_num_queries(1):
        rows = claim(n=20)
    with django_assert_num_queries(1):
        sql("SELECT pgmb.ack(%s)", ([r["delivery_id"] for r in rows[:10]],))
    with django_assert_num_queries(1):
        _fail(sql, rows[10:])
    assert Attempt.objects.count() == 20
    assert uuid.UUID(str(rows[0]["lease_id"]))
