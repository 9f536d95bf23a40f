"""Message options through the state machine: priority, ordered groups, dependencies,
de-duplication and per-message retries (docs/ordering.md). Python publishes, the typed
API (pgmb.deliveries) claims and settles; the SQL functions do the work."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, transaction

import pgmb
from pgmb import deliveries
from pgmb.deliveries import Failure, Success
from pgmb.errors import InvalidOption, UnknownDependency
from pgmb.models import Attempt, DeadLetter, Delivery, Message


def _ack(claims):
    return deliveries.ack([Success(c.delivery_id, 200, 1.0) for c in claims])


def _fail(claims, status=500):
    return deliveries.fail([Failure(c.delivery_id, c.lease_id, status, "boom") for c in claims])


def _states(*ids) -> list[str]:
    by_message = {str(d.message_id): d.state for d in Delivery.objects.all()}
    return [by_message.get(str(i), "gone") for i in ids]


def _make_due(sql):
    sql("UPDATE pgmb_delivery SET available_at = now() - interval '1 second' WHERE state = 'ready'")


# ---- priority ------------------------------------------------------------------------


def test_claims_take_lower_priorities_first_then_publish_order(make_queue):
    make_queue("#")
    late_urgent = pgmb.send("k", 1, priority=-5)
    normal = [pgmb.send("k", n) for n in range(3)]
    urgent = pgmb.send("k", 2, priority=-5)
    lazy = pgmb.send("k", 3, priority=7)
    # One at a time: which delivery a claim picks (a claim's rows come back unordered).
    order = []
    for _ in range(6):
        [c] = deliveries.claim(limit=1)
        order.append(c.message_id)
    assert order == [str(i) for i in [late_urgent, urgent, *normal, lazy]]


def test_priority_is_copied_to_the_delivery_and_a_delayed_urgent_one_waits(make_queue, sql):
    make_queue("#")
    delayed = pgmb.send("k", 1, priority=-1, delay=3600)
    now = pgmb.send("k", 2, priority=9)
    assert Delivery.objects.get(message_id=delayed).priority == -1
    assert [c.message_id for c in deliveries.claim(limit=10)] == [str(now)]
    sql("UPDATE pgmb_delivery SET available_at = now() WHERE state = 'ready'")
    assert [c.message_id for c in deliveries.claim(limit=10)] == [str(delayed)]


def test_claim_query_is_an_ordered_scan_of_the_claim_index(make_queue, sql):
    """The claim's pick of one queue, as pgmb.claim writes it: no sort above the index."""
    queue = make_queue("#")
    sql(
        "INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at, "
        "created_at, priority) "
        "SELECT gen_random_uuid(), %s, 'ready', 0, now() - n * interval '1 ms', now(), n %% 3 "
        "FROM generate_series(1, 20000) AS n",
        (queue.pk,),
    )
    sql("ANALYZE pgmb_delivery")
    plan = "\n".join(
        r[0]
        for r in sql(
            "EXPLAIN SELECT d.id FROM pgmb_delivery d "
            "WHERE d.queue_id = %s AND d.state = 'ready' AND d.available_at <= now() "
            "ORDER BY d.priority, d.available_at, d.id LIMIT 50 FOR NO KEY UPDATE SKIP LOCKED",
            (queue.pk,),
        )
    )
    assert "Index Scan using pgmb_delivery_due" in plan, plan
    assert "Sort" not in plan, plan
    # The first due time per priority: a probe per priority, not a scan of the queue.
    assert sql("SELECT pgmb.next_due(%s) < now() - interval '19 s'", (queue.pk,)) == [(True,)]


# ---- ordered groups ------------------------------------------------------------------


def test_a_group_is_delivered_one_at_a_time_in_publish_order(make_queue):
    make_queue("#")
    a = [pgmb.send("k", n, group="a") for n in range(3)]
    b = [pgmb.send("k", n, group="b") for n in range(2)]
    plain = pgmb.send("k", "plain")
    assert _states(*a, *b, plain) == ["ready", "waiting", "waiting", "ready", "waiting", "ready"]
    first = deliveries.claim(limit=10)
    assert {c.message_id for c in first} == {str(a[0]), str(b[0]), str(plain)}
    assert deliveries.claim(limit=10) == []  # the heads are leased: their groups wait
    _ack([c for c in first if c.message_id == str(a[0])])
    assert _states(*a) == ["gone", "ready", "waiting"]
    [second] = deliveries.claim(limit=10)
    assert second.message_id == str(a[1])


def test_a_failing_head_blocks_only_its_group_until_it_is_dead_lettered(make_queue, sql):
    make_queue("#", max_retries=1, backoff_base=0, backoff_max=0)
    head, behind = pgmb.send("k", 0, group="g"), pgmb.send("k", 1, group="g")
    other = pgmb.send("k", 2, group="h")
    claims = deliveries.claim(limit=10)
    assert {c.message_id for c in claims} == {str(head), str(other)}
    _fail([c for c in claims if c.message_id == str(head)])
    _ack([c for c in claims if c.message_id == str(other)])
    assert _states(head, behind) == ["ready", "waiting"]  # retried, still the head
    _make_due(sql)
    [retry] = deliveries.claim(limit=10)
    assert retry.message_id == str(head)
    _fail([retry])  # its last attempt: dead-lettered, the group goes on
    assert DeadLetter.objects.get().message_id == head
    assert _states(head, behind) == ["gone", "ready"]


def test_a_batch_of_one_group_keeps_its_order(make_queue):
    make_queue("#")
    ids = pgmb.send_batch([pgmb.Outgoing("k", n, group="g") for n in range(4)])
    assert _states(*ids) == ["ready", "waiting", "waiting", "waiting"]
    for expected in ids:
        [c] = deliveries.claim(limit=10)
        assert c.message_id == str(expected)
        _ack([c])


def test_groups_are_per_queue(make_queue):
    make_queue("a.#", name="qa")
    make_queue("#", name="qall")
    first = pgmb.send("a.x", 1, group="g")
    second = pgmb.send("b.x", 2, group="g")  # only qall: waits behind first there
    rows = {
        (str(d.message_id), d.queue.name): d.state for d in Delivery.objects.select_related("queue")
    }
    assert rows == {
        (str(first), "qa"): "ready",
        (str(first), "qall"): "ready",
        (str(second), "qall"): "waiting",
    }


def test_a_requeued_head_goes_behind_its_group(make_queue):
    make_queue("#", max_retries=0)
    head, second, third = (pgmb.send("k", n, group="g") for n in range(3))
    _fail(deliveries.claim(limit=10))
    assert _states(head, second, third) == ["gone", "ready", "waiting"]
    deliveries.requeue(DeadLetter.objects.values_list("id", flat=True))
    assert _states(head, second, third) == ["waiting", "ready", "waiting"]
    order = []
    for _ in range(3):
        [c] = deliveries.claim(limit=10)
        order.append(c.message_id)
        _ack([c])
    assert order == [str(second), str(third), str(head)]


# ---- dependencies --------------------------------------------------------------------


def test_a_dependent_waits_until_its_dependency_is_acked(make_queue):
    make_queue("a", name="qa")
    make_queue("b", name="qb")
    first = pgmb.send("a", 1)
    then = pgmb.send("b", 2, depends_on=[first])
    assert _states(first, then) == ["ready", "waiting"]
    [c] = deliveries.claim(limit=10)
    assert c.message_id == str(first)
    assert Delivery.objects.get(message_id=first).dependents
    _ack([c])
    assert _states(first, then) == ["gone", "ready"]


def test_a_dead_lettered_dependency_holds_until_purged_or_requeued_and_acked(make_queue):
    make_queue("a", name="qa", max_retries=0)
    make_queue("b", name="qb")
    first = pgmb.send("a", 1)
    then = pgmb.send("b", 2, depends_on=[first])
    _fail(deliveries.claim(["qa"]))
    assert _states(then) == ["waiting"]
    deliveries.requeue_queue("qa")
    assert _states(first, then) == ["ready", "waiting"]
    _fail(deliveries.claim(["qa"]))
    assert _states(then) == ["waiting"]
    deliveries.purge_queue_dead_letters("qa")
    assert _states(then) == ["ready"]


def test_dependencies_in_one_batch_and_already_settled_ones(make_queue):
    make_queue("#")
    gone = pgmb.send("k", 0)
    _ack(deliveries.claim())
    first, second = uuid.uuid4(), uuid.uuid4()
    pgmb.send_batch(
        [
            pgmb.Outgoing("k", 1, message_id=first),
            pgmb.Outgoing("k", 2, message_id=second, depends_on=[first, gone]),
        ]
    )
    assert _states(first, second) == ["ready", "waiting"]
    _ack(deliveries.claim())
    assert _states(second) == ["ready"]


def test_an_unknown_dependency_is_refused_and_nothing_is_stored(make_queue):
    make_queue("#")
    with pytest.raises(UnknownDependency, match="does not exist"), transaction.atomic():
        pgmb.send("k", 1, depends_on=[uuid.uuid4()])
    with pytest.raises(UnknownDependency), transaction.atomic():
        pgmb.send_batch([("k", 0), pgmb.Outgoing("k", 1, depends_on=[uuid.uuid4()])])
    assert Message.objects.count() == 0


def test_a_message_cannot_depend_on_itself():
    mid = uuid.uuid4()
    with pytest.raises(InvalidOption, match="itself"):
        pgmb.send("k", 1, message_id=mid, depends_on=[mid])


# ---- de-duplication ------------------------------------------------------------------


def test_a_duplicate_within_the_window_is_dropped_and_the_sender_gets_the_first_id(make_queue):
    make_queue("#")
    first = pgmb.send("k", 1, dedup_id="order-7")
    again = pgmb.send("k", 2, dedup_id="order-7")
    assert again == first
    assert Message.objects.count() == 1 and Delivery.objects.count() == 1
    other = pgmb.send("k", 3, dedup_id="order-8")
    assert other != first


def test_the_window_edges_come_from_the_queue_setting(make_queue, sql):
    make_queue("#", dedup_window=60)
    first = pgmb.send("k", 1, dedup_id="d")
    # Just inside the window: still a duplicate.
    sql("UPDATE pgmb_message SET created_at = now() - interval '59.999 s' WHERE id = %s", (first,))
    assert pgmb.send("k", 2, dedup_id="d") == first
    # At the edge: the window is over.
    sql("UPDATE pgmb_message SET created_at = now() - interval '60 s' WHERE id = %s", (first,))
    second = pgmb.send("k", 3, dedup_id="d")
    assert second != first
    assert Message.objects.filter(dedup_id="d").count() == 2


def _queues_of(message_id) -> list[str]:
    return sorted(
        Delivery.objects.filter(message_id=message_id).values_list("queue__name", flat=True)
    )


def test_each_queue_counts_its_own_window_and_zero_turns_it_off(make_queue, sql):
    make_queue("a.#", name="short", dedup_window=10)
    make_queue("a.b", name="long", dedup_window=100)
    make_queue("a.#", name="off", dedup_window=0)
    first = pgmb.send("a.b", 1, dedup_id="x")
    sql("UPDATE pgmb_message SET created_at = now() - interval '50 s'")
    # A duplicate for "long" only: stored, and delivered to the other two.
    second = pgmb.send("a.b", 2, dedup_id="x")
    assert second != first
    assert _queues_of(second) == ["off", "short"]
    # "long" does not match a.z; "short" got the second just now.
    third = pgmb.send("a.z", 3, dedup_id="x")
    assert _queues_of(third) == ["off"]


def test_a_duplicate_for_every_queue_is_dropped_and_names_the_message_of_its_queues(
    make_queue, sql
):
    make_queue("a.pay", name="pay")
    make_queue("b.#", name="other")
    mine = pgmb.send("a.pay", 1, dedup_id="pay-7")
    later = pgmb.send("b.x", 2, dedup_id="pay-7")  # another queue's: no duplicate there
    assert later != mine and _queues_of(later) == ["other"]
    # The newest message with the id is another queue's: the duplicate names its own.
    assert pgmb.send("a.pay", 3, dedup_id="pay-7") == mine
    assert Message.objects.filter(dedup_id="pay-7").count() == 2


def test_a_message_to_a_key_nobody_listens_on_suppresses_no_other_producers(make_queue, sql):
    """Issue 21: a producer publishing to a key no queue gets, with the victim's dedup id,
    made the victim's message vanish (the dedup id was global)."""
    victims = make_queue("a.pay", name="pay")
    make_queue("b.#", name="attackers")
    sql("CREATE ROLE pgmb_test_attacker LOGIN; GRANT pgmb_producer TO pgmb_test_attacker")
    try:
        sql("SET ROLE pgmb_test_attacker")
        [(attack,)] = sql(
            "SELECT pgmb.send(gen_random_uuid(), 'nobody.listens', '1'::jsonb, NULL::jsonb,"
            " NULL::timestamptz, dedup_id => 'pay-7')"
        )
        [(attack_routed,)] = sql(
            "SELECT pgmb.send(gen_random_uuid(), 'b.elsewhere', '1'::jsonb, NULL::jsonb,"
            " NULL::timestamptz, dedup_id => 'pay-8')"
        )
        sql("RESET ROLE")
        victim = pgmb.send("a.pay", {"amount": 7}, dedup_id="pay-7")
        victim2 = pgmb.send("a.pay", {"amount": 8}, dedup_id="pay-8")
    finally:
        sql("RESET ROLE")
        sql("DROP ROLE pgmb_test_attacker")
    assert victim != attack and victim2 != attack_routed
    assert _queues_of(victim) == ["pay"] and _queues_of(victim2) == ["pay"]
    assert Delivery.objects.filter(queue=victims).count() == 2


def test_in_one_batch_a_later_message_does_not_hide_an_earlier_one(make_queue):
    make_queue("a", name="only_a")
    make_queue("b", name="only_b")
    make_queue("#", name="every")
    ids = pgmb.send_batch(
        [pgmb.Outgoing("a", 1, dedup_id="d"), pgmb.Outgoing("b", 2, dedup_id="d")]
    )
    # The second duplicates the first for "every" only: stored, delivered to only_b; the
    # first, published before it, still goes to "every".
    assert ids[0] != ids[1]
    assert _queues_of(ids[0]) == ["every", "only_a"]
    assert _queues_of(ids[1]) == ["only_b"]


def test_duplicates_in_one_batch_get_the_first_id(make_queue):
    make_queue("#")
    ids = pgmb.send_batch(
        [
            pgmb.Outgoing("k", 1, dedup_id="a"),
            pgmb.Outgoing("k", 2),
            pgmb.Outgoing("k", 3, dedup_id="a"),
        ]
    )
    assert ids[2] == ids[0] and len(set(ids)) == 2
    assert Message.objects.count() == 2


# ---- per-message retries -------------------------------------------------------------


def test_max_retries_and_retry_delay_of_the_message_replace_the_queues(make_queue, sql):
    make_queue("#", max_retries=0, backoff_base=0, backoff_max=0)
    mid = pgmb.send("k", 1, max_retries=2, retry_delay=120)
    plain = pgmb.send("k", 2)
    claims = deliveries.claim(limit=10)
    assert {(c.message_id, c.max_attempts) for c in claims} == {(str(mid), 3), (str(plain), 1)}
    _fail(claims)
    assert DeadLetter.objects.get().message_id == plain
    [waiting] = sql(
        "SELECT available_at - now() BETWEEN interval '119 s' AND interval '121 s' "
        "FROM pgmb_delivery WHERE message_id = %s",
        (mid,),
    )
    assert waiting == (True,)
    for _attempt in (2, 3):
        _make_due(sql)
        _fail(deliveries.claim(limit=10))
    assert sorted(Attempt.objects.filter(message_id=mid).values_list("outcome", flat=True)) == [
        "dead",
        "retry",
        "retry",
    ]


# ---- SQL ------------------------------------------------------------------------------


def test_sql_send_takes_the_options_by_name_and_old_calls_still_work(make_queue, sql):
    make_queue("#")
    [(a,)] = sql("SELECT pgmb.send(gen_random_uuid(), 'k', '1')")
    [(b,)] = sql("SELECT pgmb.send(gen_random_uuid(), 'k', '1', '{}')")
    [(c,)] = sql("SELECT pgmb.send(gen_random_uuid(), 'k', '1', '{}', 5)")
    [(d,)] = sql("SELECT pgmb.send(gen_random_uuid(), 'k', '1', '{}', now())")
    [(e,)] = sql(
        "SELECT pgmb.send(gen_random_uuid(), 'k', '1', NULL, NULL::timestamptz, priority => -3, "
        "group_key => 'g', depends_on => ARRAY[%s::uuid], dedup_id => 'dd', max_retries => 1, "
        "retry_delay => 2.5)",
        (a,),
    )
    m = Message.objects.get(pk=e)
    assert (m.priority, m.group_key, m.depends_on, m.dedup_id) == (-3, "g", [a], "dd")
    assert (m.max_retries, m.retry_delay) == (1, 2.5)
    [(again,)] = sql(
        "SELECT pgmb.send(gen_random_uuid(), 'k', '1', NULL, NULL::timestamptz, dedup_id => 'dd')"
    )
    assert again == e
    assert len({a, b, c, d, e}) == 5


def test_queue_entries_show_waiting(make_queue):
    queue = make_queue("#", name="orders")
    pgmb.send("k", 1, group="g")
    pgmb.send("k", 2, group="g")
    with connection.cursor() as cursor:
        cursor.execute("SELECT state FROM pgmb.orders_queue ORDER BY enqueued_at, message_id")
        states = sorted(r[0] for r in cursor.fetchall())
    assert states == ["ready", "waiting"]
    assert queue.deliveries.count() == 2


def test_metrics_count_waiting_deliveries(make_queue, sql):
    make_queue("#", name="orders")
    for n in range(3):
        pgmb.send("k", n, group="g")
    [(length, visible, total)] = sql(
        "SELECT queue_length, queue_visible_length, total_messages FROM pgmb.metrics('orders')"
    )
    assert (length, visible, total) == (3, 1, 3)


def test_a_dependent_held_by_a_dead_letter_is_not_busy(make_queue):
    make_queue("a", name="qa", max_retries=0)
    make_queue("b", name="qb")
    first = pgmb.send("a", 1)
    pgmb.send("b", 2, depends_on=[first])
    assert deliveries.busy()
    _fail(deliveries.claim(["qa"]))
    # Nothing to do until an operator requeues or purges the dead letter.
    assert not deliveries.busy()


def test_a_replayed_message_keeps_its_options_and_goes_behind_its_group(make_queue):
    make_queue("#")
    first = pgmb.send("k", 1, group="g", priority=4)
    _ack(deliveries.claim())
    second = pgmb.send("k", 2, group="g")
    assert deliveries.replay(first) == 1
    replayed = Delivery.objects.get(message_id=first)
    assert (replayed.group_key, replayed.priority, replayed.state) == ("g", 4, "waiting")
    assert _states(second) == ["ready"]
