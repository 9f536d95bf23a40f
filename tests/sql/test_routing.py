"""Topic routing: the truth table, run through the SQL compiler, the Python compiler and
the trigger itself, so all three agree."""

import itertools

import pytest

from pgmb import deliveries, routing
from pgmb.models import Delivery, Message

# (binding key, routing key, routed?)
TRUTH_TABLE = [
    ("order.*", "order.created", True),
    ("order.*", "order", False),
    ("order.*", "order.created.eu", False),
    ("order.#", "order", True),
    ("order.#", "order.created", True),
    ("order.#", "order.created.eu", True),
    ("order.#", "orders.created", False),
    ("order.#", "xorder", False),
    ("#", "anything", True),
    ("#", "a.b.c.d", True),
    ("#", ".", True),
    ("#.created", "created", True),
    ("#.created", "order.created", True),
    ("#.created", "order.eu.created", True),
    ("#.created", "order.created.eu", False),
    ("#.created", "xcreated", False),
    ("order.#.eu", "order.eu", True),
    ("order.#.eu", "order.created.eu", True),
    ("order.#.eu", "order.created.paid.eu", True),
    ("order.#.eu", "order.created.us", False),
    ("order.#.eu", "order.eu.x", False),
    ("*", "order", True),
    ("*", "order.created", False),
    ("*.created", "order.created", True),
    ("*.created", ".created", True),
    ("*.created", "created", False),
    ("*.*", "a.b", True),
    ("*.*", "a", False),
    ("*.#", "a", True),
    ("*.#", "a.b.c", True),
    ("#.*", "a", True),
    ("#.#", "a.b", True),
    ("a.*.c", "a..c", True),
    ("a.*.c", "a.c", False),
    ("a..c", "a..c", True),
    ("a..c", "a.b.c", False),
    ("a.#", "a.", True),
    ("a.*", "a.", True),
    ("order.created", "order.created", True),
    ("order.created", "order.createdx", False),
    ("order.created", "order_created", False),
    ("order_created", "orderxcreated", False),
    ("order%", "order%", True),
    ("order%", "orders", False),
    ("a+b", "aab", False),
    ("a+b", "a+b", True),
    ("a(b)", "a(b)", True),
    ("[x]", "[x]", True),
    ("[x]", "x", False),
    ("a\\b", "a\\b", True),
    ("café.*", "café.crème", True),
    ("$.^", "$.^", True),
]


@pytest.mark.parametrize(("binding", "key", "routed"), TRUTH_TABLE)
def test_python_compiler(binding, key, routed):
    assert routing.matches(routing.compile_binding(binding), key) is routed


def test_sql_and_python_compile_identically_and_agree(sql):
    rows = sql(
        "SELECT b, k, pgmb.compile_binding(b), pgmb.matches(b, k) "
        "FROM unnest(%s::text[], %s::text[]) AS t(b, k)",
        ([b for b, _, _ in TRUTH_TABLE], [k for _, k, _ in TRUTH_TABLE]),
    )
    for (binding, key, pattern, matched), (_, _, routed) in zip(rows, TRUTH_TABLE, strict=True):
        assert pattern == routing.compile_binding(binding), binding
        assert matched is routed, (binding, key)


def test_trigger_routes_by_the_truth_table(make_worker, make_queue, sql):
    worker = make_worker()
    bindings = sorted({b for b, _, _ in TRUTH_TABLE})
    queues = {b: make_queue(b, worker=worker) for b in bindings}
    keys = sorted({k for _, k, _ in TRUTH_TABLE})
    sql(
        "INSERT INTO pgmb_message (routing_key, body) SELECT k, '{}' FROM unnest(%s::text[]) k",
        (keys,),
    )
    routed = set(
        Delivery.objects.values_list("queue__binding_key", "message__routing_key").iterator()
    )
    for binding, key, expected in TRUTH_TABLE:
        assert ((binding, key) in routed) is expected, (binding, key)
    assert Message.objects.count() == len(keys)
    assert len(queues) == len(bindings)


def test_changing_a_binding_affects_future_messages_only(make_queue, sql):
    queue = make_queue("order.*")
    sql("SELECT pgmb.send(gen_random_uuid(), 'order.created', '1'::jsonb)")
    queue.binding_key = "invoice.*"
    queue.save()
    queue.refresh_from_db()
    assert queue.pattern == routing.compile_binding("invoice.*")
    sql("SELECT pgmb.send(gen_random_uuid(), 'order.created', '2'::jsonb)")
    sql("SELECT pgmb.send(gen_random_uuid(), 'invoice.paid', '3'::jsonb)")
    bodies = sorted(Delivery.objects.filter(queue=queue).values_list("message__body", flat=True))
    assert bodies == [1, 3]


def test_many_queues_route_exactly(make_worker, make_queue, sql):
    """More queues than PostgreSQL's 32 cached regexes, with literal and wildcard first words."""
    worker = make_worker()
    queues = {f"svc{n}.*.#": make_queue(f"svc{n}.*.#", worker=worker) for n in range(60)}
    queues["*.created"] = make_queue("*.created", worker=worker)
    queues["#.eu"] = make_queue("#.eu", worker=worker)
    keys = ["svc7.a.b", "svc7.created", "svc59.x.eu", "svc60.a", "other.created", "eu"]
    routed = _publish_and_compare(sql, list(queues), keys)
    assert ("svc7.*.#", "svc7.a.b") in routed and ("#.eu", "svc59.x.eu") in routed


def _publish_and_compare(sql, bindings: list[str], keys: list[str]) -> set[tuple[str, str]]:
    """Publish one message per key in one statement; the (binding, key) pairs routed, which
    must be those Python's matcher gives."""
    sql(
        "INSERT INTO pgmb_message (routing_key, body) SELECT k, '1' FROM unnest(%s::text[]) k",
        (keys,),
    )
    routed = set(Delivery.objects.values_list("queue__binding_key", "message__routing_key"))
    expected = {
        (binding, key)
        for binding in bindings
        for key in keys
        if routing.matches(routing.compile_binding(binding), key)
    }
    assert routed == expected
    return routed


def test_candidate_queues_by_literal_words_miss_no_match(make_worker, make_queue, sql):
    """Routing picks candidates by the bindings' literal words (migration 0019) before it
    runs their regexes: every shape of binding, many keys, the same answer as Python's."""
    worker = make_worker()
    shapes = ("s{n}.*.#", "*.s{n}.created", "#.s{n}", "s{n}.#.eu", "#.s{n}.#", "s{n}", "*.*.s{n}")
    bindings = [shape.format(n=n) for n in range(12) for shape in shapes]
    bindings += ["#", "*", "*.*", "#.*", "a..c"]
    for binding in bindings:
        make_queue(binding, worker=worker)
    words = ["s1", "s7", "s11", "created", "eu", "x", "", "a", "c"]
    keys = sorted({".".join(c) for c in itertools.product(words, repeat=3)} | set(words) - {""})
    routed = _publish_and_compare(sql, bindings, keys)
    assert len(routed) > 1000  # not vacuous


def test_literal_words_follow_the_binding(make_queue, sql):
    queue = make_queue("order.*.#.eu")
    literal = "SELECT literal_words FROM pgmb_queue WHERE id = %s"
    assert sql(literal, (queue.pk,)) == [(["order", "eu"],)]
    queue.binding_key = "#"
    queue.save()
    assert sql(literal, (queue.pk,)) == [([],)]


def test_deleting_a_queue_in_sql_takes_its_deliveries_and_dead_letters(make_queue, sql):
    queue = make_queue("#", name="doomed", max_retries=0)
    other = make_queue("#", name="kept")
    pgmb_send = "SELECT pgmb.send(gen_random_uuid(), 'k', '1')"
    sql(pgmb_send)
    sql(pgmb_send)
    [claimed] = deliveries.claim(["doomed"], 1)
    deliveries.fail([deliveries.Failure(claimed.delivery_id, claimed.lease_id)])
    sql("DELETE FROM pgmb_queue WHERE id = %s", (queue.pk,))
    assert sql("SELECT count(*) FROM pgmb_delivery WHERE queue_id = %s", (queue.pk,)) == [(0,)]
    assert sql("SELECT count(*) FROM pgmb_dead_letter WHERE queue_id = %s", (queue.pk,)) == [(0,)]
    assert sql("SELECT count(*) FROM pgmb_delivery WHERE queue_id = %s", (other.pk,)) == [(2,)]
