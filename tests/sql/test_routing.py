"""Topic routing: the truth table, run through the SQL compiler, the Python compiler and
the trigger itself, so all three agree."""

import itertools
import random

import pytest

from pgmb import deliveries, routing
from pgmb.models import Delivery, Message, Queue

#: The longest keys allowed (255 characters, 124 words), "first" and "last" at the ends.
LONGEST = ".".join(["first", *["x"] * 118, "yy", "x", "x", "x", "last"])
#: As LONGEST with one word changed, past the places the routing tags name.
LONGEST_OTHER = LONGEST.replace("yy", "zz")

assert len(LONGEST) == routing.MAX_KEY_LENGTH

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
    # The places of literal words (routing tags, pgmb/sql/schema/routing.sql): `#` in the
    # middle, `*` before and after `#`, repeated words, a word at another place, single words, the
    # places past the four that the tags name, and the longest keys.
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "b.x.a", False),
    ("*.#.b", "a.b", True),
    ("*.#.b", "b", False),
    ("#.*.b", "x.y.b", True),
    ("a.#.*", "a.x", True),
    ("a.#.*", "a", False),
    ("*.a.#.b.*", "x.a.b.y", True),
    ("*.a.#.b.*", "a.x.b.y", False),
    ("#.a.#", "x.a.y", True),
    ("#.a.#", "x.y", False),
    ("a.*.b", "a.x.b", True),
    ("a.*.b", "b.x.a", False),
    ("a.*.b", "a.b.b", True),
    ("a.a", "a.a", True),
    ("a.a", "a", False),
    ("a.#.a", "a", False),
    ("a.#.a", "a.a", True),
    ("b.#", "a.b", False),
    ("#.a", "a.b", False),
    ("*.*.*.d.#", "a.b.c.d.e", True),
    ("*.*.*.d.#", "d.b.c.a.e", False),
    ("*.*.*.*.e.#", "a.b.c.d.e.f", True),
    ("*.*.*.*.e.#", "e.b.c.d.x.f", False),
    ("#.e.*.*.*.*", "e.a.b.c.d", True),
    ("#.e.*.*.*.*", "a.b.c.d.e", False),
    ("a.b.c.d.e.f.g.h.i", "a.b.c.d.e.f.g.h.i", True),
    ("a.b.c.d.e.f.g.h.i", "a.b.c.d.x.f.g.h.i", False),
    ("a.b.c.d.e.f.g.h.i", "a.b.c.d.f.e.g.h.i", False),
    ("a", "a", True),
    ("a", "b", False),
    ("a", "a.a", False),
    ("#", "a", True),
    ("*", "a", True),
    ("#.a.#.b.#", "b.a.b", True),
    ("#.a.#.b.#", "b.a", False),
    (LONGEST, LONGEST, True),
    (LONGEST, LONGEST_OTHER, False),
    ("first.#.last", LONGEST, True),
    ("#.x.#", LONGEST, True),
    ("*.x.#.x.*", LONGEST, True),
    ("#.yy.x.x.x.*", LONGEST, True),
    ("#.yy.x.x.x.*", LONGEST_OTHER, False),
    ("last.#", LONGEST, False),
    ("#.first", LONGEST, False),
    ("#", LONGEST, True),
    ("*", LONGEST, False),
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


def test_messages_sharing_keys_each_get_their_deliveries(make_worker, make_queue, sql):
    """Queues are decided once per distinct key of a statement (0029): every message of the
    statement still gets its own delivery to each queue its key matches, and no other."""
    worker = make_worker()
    bindings = ["order.*", "order.#", "#.eu", "*.*", "invoice.#"]
    for binding in bindings:
        make_queue(binding, worker=worker)
    keys = ["order.created", "order.created.eu", "user.deleted", "nothing"]
    sent = sql(
        "INSERT INTO pgmb_message (routing_key, body)"
        " SELECT (%s::text[])[1 + n %% 4], to_jsonb(n) FROM generate_series(0, 299) n"
        " RETURNING id, routing_key",
        (keys,),
    )
    got: dict[str, set[str]] = {}
    for message_id, binding in Delivery.objects.values_list("message_id", "queue__binding_key"):
        got.setdefault(str(message_id), set()).add(binding)
    for message_id, key in sent:
        expected = {b for b in bindings if routing.matches(routing.compile_binding(b), key)}
        assert got.get(str(message_id), set()) == expected, key
    assert Delivery.objects.count() == 75 * (3 + 2 + 1 + 0)


@pytest.mark.parametrize("keys", [["job"], ["a", "x.b", "c.d", "x.b.y", "e"]])
def test_deliveries_are_created_in_publish_order(make_queue, sql, keys):
    """Delivery ids follow the messages' order in the statement, whatever the join's order
    (ordered groups rely on it: pgmb.hold_delivery)."""
    make_queue("#")
    make_queue("*.b")
    sent = sql(
        "INSERT INTO pgmb_message (routing_key, body)"
        " SELECT (%s::text[])[1 + mod(n * 7, cardinality(%s::text[]))], to_jsonb(n)"
        " FROM generate_series(0, 199) n RETURNING body::int",
        (keys, keys),
    )
    assert [body for (body,) in sent] == list(range(200))
    for queue in Queue.objects.all():
        bodies = list(
            Delivery.objects.filter(queue=queue)
            .order_by("id")
            .values_list("message__body", flat=True)
        )
        assert bodies == sorted(bodies), queue.binding_key


def test_the_tags_index_keeps_no_pending_list(sql):
    """Routing searches pgmb_queue_binding_tags at every publish; a GIN pending list (only a
    vacuum empties it) would be scanned whole each time (pgmb/sql/schema/tables.sql)."""
    [(options,)] = sql(
        "SELECT reloptions FROM pg_class WHERE oid = 'pgmb_queue_binding_tags'::regclass"
    )
    assert "fastupdate=off" in options


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


def test_candidate_queues_by_tags_miss_no_match(make_worker, make_queue, sql):
    """Routing picks candidates by the bindings' tags (pgmb/sql/schema/routing.sql) before it
    runs their regexes: every shape of binding, many keys, the same answer as Python's."""
    worker = make_worker()
    shapes = ("s{n}.*.#", "*.s{n}.created", "#.s{n}", "s{n}.#.eu", "#.s{n}.#", "s{n}", "*.*.s{n}")
    bindings = [shape.format(n=n) for n in range(12) for shape in shapes]
    bindings += ["#", "*", "*.*", "#.*", "a..c", "*.#.c.*", "a.#.a", "#.created.*.*.*.*"]
    for binding in bindings:
        make_queue(binding, worker=worker)
    words = ["s1", "s7", "s11", "created", "eu", "x", "", "a", "c"]
    keys = sorted({".".join(c) for c in itertools.product(words, repeat=3)} | set(words) - {""})
    keys += ["a.s1.x.x.created.c.eu", "created.x.x.x.x", "s1.a.a.a.a.a.a.a.a.a.created"]
    routed = _publish_and_compare(sql, bindings, keys)
    assert len(routed) > 1000  # not vacuous


# (binding key, its tags): a literal word's place from the start while no `#` precedes it
# ("i.w"), else from the end while no `#` follows it ("-j.w"), at most 4th either way;
# else the plain word.
BINDING_TAGS = [
    ("order.*", ["1.order"]),
    ("order.*.#.eu", ["1.order", "-1.eu"]),
    ("*.svc1.created", ["2.svc1", "3.created"]),
    ("#.svc1", ["-1.svc1"]),
    ("a.#.b.#.c", ["1.a", "b", "-1.c"]),
    ("*.#.x.*", ["-2.x"]),
    ("a.b.c.d.e.f", ["1.a", "2.b", "3.c", "4.d", "-2.e", "-1.f"]),
    ("a.b.c.d.e.f.g.h.i.j", ["1.a", "2.b", "3.c", "4.d", "e", "f", "-4.g", "-3.h", "-2.i", "-1.j"]),
    ("*.*.*.*.e.#", ["e"]),
    ("a.a", ["1.a", "2.a"]),
    ("a..b", ["1.a", "2.", "3.b"]),
    ("1.2", ["1.1", "2.2"]),
    ("#", []),
    ("*", []),
    ("*.#.*", []),
]


@pytest.mark.parametrize(("binding", "tags"), BINDING_TAGS)
def test_binding_tags(binding, tags, sql):
    assert sql("SELECT pgmb.binding_tags(%s)", (binding,)) == [(tags,)]


def test_key_tags_name_every_word_at_its_places(sql):
    [(tags,)] = sql("SELECT pgmb.key_tags('order.created.eu')")
    words = ["order", "created", "eu"]
    from_start = ["1.order", "2.created", "3.eu", "4."]
    from_end = ["-1.eu", "-2.created", "-3.order", "-4."]
    assert sorted(tags) == sorted([*words, *from_start, *from_end])


def test_binding_tags_follow_the_binding(make_queue, sql):
    queue = make_queue("order.*.#.eu")
    tags = "SELECT binding_tags FROM pgmb_queue WHERE id = %s"
    assert sql(tags, (queue.pk,)) == [(["1.order", "-1.eu"],)]
    queue.binding_key = "#"
    queue.save()
    assert sql(tags, (queue.pk,)) == [([],)]
    sql("UPDATE pgmb_queue SET binding_key = 'a.*.b' WHERE id = %s", (queue.pk,))
    assert sql(tags, (queue.pk,)) == [(["1.a", "3.b"],)]


def _random_keys(rng: random.Random, count: int, wildcards: bool) -> list[str]:
    words = ["a", "b", "x", ""] + (["*", "#", "*", "#"] if wildcards else [])
    keys: set[str] = set()
    while len(keys) < count:
        key = ".".join(rng.choice(words) for _ in range(rng.randint(1, 10)))
        if key:
            keys.add(key)
    return sorted(keys)


def test_tags_never_reject_a_match(sql):
    """The tags are an exact pre-filter: over every pair of the truth table's bindings and
    keys and of random ones, each pair Python's matcher routes has the binding's tags among
    the key's; and the filter does filter."""
    rng = random.Random(20261123)
    bindings = sorted({b for b, _, _ in TRUTH_TABLE} | set(_random_keys(rng, 400, True)))
    keys = sorted({k for _, k, _ in TRUTH_TABLE} | set(_random_keys(rng, 400, False)))
    passed = set(
        sql(
            "WITH b AS (SELECT b, pgmb.binding_tags(b) AS tags FROM unnest(%s::text[]) b),"
            " k AS (SELECT k, pgmb.key_tags(k) AS tags FROM unnest(%s::text[]) k)"
            " SELECT b.b, k.k FROM b, k WHERE b.tags <@ k.tags",
            (bindings, keys),
        )
    )
    patterns = {b: routing.compile_binding(b) for b in bindings}
    matched = {(b, k) for b in bindings for k in keys if routing.matches(patterns[b], k)}
    assert matched - passed == set()
    assert len(matched) > 10_000  # not vacuous
    # Of the pairs that do not match, most never reach a regex.
    assert len(passed - matched) < 0.2 * (len(bindings) * len(keys) - len(matched))


def test_a_word_at_another_place_brings_no_candidate(make_worker, make_queue, sql):
    """What 0027 is for: `*.svc1.created` shares the word `created` with `order.created`,
    but not its place, so the index does not hand it to the regex."""
    worker = make_worker()
    for binding in ("*.svc1.created", "#.svc1", "svc1.*.#", "order.*", "#.created", "*.order"):
        make_queue(binding, worker=worker)
    candidates = sql(
        "SELECT binding_key FROM pgmb_queue WHERE binding_tags <@ pgmb.key_tags('order.created')"
        " ORDER BY binding_key"
    )
    assert candidates == [("#.created",), ("order.*",)]


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
