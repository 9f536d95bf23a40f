"""A role learns nothing from pgmb's answers about what it may not see
(docs/decisions/0039-refusals-tell-nothing.md).

A producer may not read messages, so it is never told that a message id is taken, that a
dependency does not exist, or the id of a message its own duplicates. A consumer is
refused a queue not granted to it with the same error whether that queue exists or not,
is a pull queue or not, and is never told the delivery ids of another's queue. The roles
are real login roles; the application's role (the owner) is still told everything.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

import pgmb
from pgmb import access
from pgmb.models import Delivery, Message

pytestmark = pytest.mark.django_db(transaction=True)

SEND = "SELECT pgmb.send(%s, %s, %s::jsonb)"


def _pull_queue(owner: psycopg.Connection, name: str, key: str) -> None:
    owner.execute("SELECT pgmb.create(%s, %s, 5, NULL)", [name, key])


def _refusal(conn: psycopg.Connection, statement: str, *params: object) -> tuple[str, str]:
    """The SQLSTATE and message of the error ``statement`` raises."""
    with pytest.raises(psycopg.Error) as raised:
        conn.execute(statement, params)
    return raised.value.sqlstate or "", raised.value.diag.message_primary or ""


# ---- producers -------------------------------------------------------------------------


def test_a_taken_id_is_not_told_to_a_producer_and_nothing_is_overwritten(make_queue, login_role):
    make_queue("order.#")
    taken = pgmb.send("order.created", {"by": "the application"})
    _, producer = login_role("pgmb_producer")

    (answer,) = producer.execute(SEND, [taken, "order.created", '{"by": "a producer"}']).fetchone()

    # The same answer as for an id nobody used: the id it sent.
    fresh = uuid.uuid4()
    assert producer.execute(SEND, [fresh, "order.created", "{}"]).fetchone() == (fresh,)
    assert answer == taken
    assert Message.objects.get(pk=taken).body == {"by": "the application"}
    assert Delivery.objects.filter(message_id=taken).count() == 1


def test_the_owner_is_still_told_that_an_id_is_taken(owner, make_queue):
    make_queue("order.#")
    taken = pgmb.send("order.created", {})
    with pytest.raises(psycopg.errors.UniqueViolation, match=f"message {taken} already exists"):
        owner.execute(SEND, [taken, "order.created", "{}"])


def test_a_producer_is_not_told_the_id_of_the_message_its_own_duplicates(make_queue, login_role):
    make_queue("order.#", dedup_window=3600)
    _, producer = login_role("pgmb_producer")
    first, mine = uuid.uuid4(), uuid.uuid4()
    send = (
        "SELECT pgmb.send(%s, 'order.created', %s::jsonb, NULL::jsonb, NULL::timestamptz,"
        " dedup_id => 'order-7')"
    )
    producer.execute(send, [first, '{"n": 1}'])

    (answer,) = producer.execute(send, [mine, '{"n": 2}']).fetchone()

    assert answer == mine != first
    assert list(Message.objects.values_list("pk", flat=True)) == [first]


def test_a_dependency_that_does_not_exist_is_not_told_to_a_producer(make_queue, login_role):
    queue = make_queue("order.#")
    _, producer = login_role("pgmb_producer")
    unknown = uuid.uuid4()

    (sent,) = producer.execute(
        "SELECT pgmb.send(gen_random_uuid(), 'order.created', '{}'::jsonb, NULL::jsonb,"
        " NULL::timestamptz, depends_on => ARRAY[%s]::uuid[])",
        [unknown],
    ).fetchone()

    # Stored and due, as a message whose dependency was settled and archived long ago.
    delivery = Delivery.objects.get(message_id=sent)
    assert (delivery.queue_id, delivery.state) == (queue.id, "ready")


def test_the_owner_is_still_told_that_a_dependency_does_not_exist(owner, make_queue):
    make_queue("order.#")
    unknown = uuid.uuid4()
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match=f"{unknown}, which does not"):
        owner.execute(
            "SELECT pgmb.send(gen_random_uuid(), 'order.created', '{}'::jsonb, NULL::jsonb,"
            " NULL::timestamptz, depends_on => ARRAY[%s]::uuid[])",
            [unknown],
        )
    assert Message.objects.count() == 0


# ---- consumers -------------------------------------------------------------------------

CALLS = [
    "SELECT * FROM pgmb.read(%s, 30, 1)",
    "SELECT * FROM pgmb.pop(%s, 1)",
    "SELECT pgmb.delete(%s, ARRAY[1]::bigint[])",
    "SELECT pgmb.purge(%s)",
    "SELECT pgmb.pull_next_visible(%s)",
    "SELECT pgmb.require('consume', %s)",
]


@pytest.mark.parametrize("call", CALLS)
def test_a_queue_not_granted_is_refused_alike_whether_it_exists_or_not(
    owner, make_queue, login_role, call
):
    _pull_queue(owner, "granted", "mine.#")
    _pull_queue(owner, "someone_elses", "theirs.#")
    make_queue("push.#", name="pushed")
    name, consumer = login_role()
    access.grant_queue_access("granted", name)

    refusals = {
        queue: _refusal(consumer, call, queue)
        for queue in ("someone_elses", "pushed", "no_such_queue")
    }

    assert refusals == {
        queue: ("42501", f"role {name} may not consume queue '{queue}'") for queue in refusals
    }


def test_the_owner_is_still_told_what_is_wrong_with_a_queue(owner, make_queue):
    make_queue("push.#", name="pushed")
    assert _refusal(owner, "SELECT * FROM pgmb.read(%s, 30, 1)", "no_such_queue") == (
        "42704",
        "queue 'no_such_queue' does not exist",
    )
    sqlstate, message = _refusal(owner, "SELECT * FROM pgmb.read(%s, 30, 1)", "pushed")
    assert sqlstate == "42809" and message.startswith("queue 'pushed' is not a pull queue: worker")


def test_a_consumer_granted_a_push_queue_is_not_told_its_worker(make_queue, login_role):
    queue = make_queue("push.#", name="pushed")
    name, consumer = login_role()
    access.grant_queue_access("pushed", name)

    assert _refusal(consumer, "SELECT * FROM pgmb.read(%s, 30, 1)", "pushed") == (
        "42809",
        "queue 'pushed' is not a pull queue: a worker receives its messages",
    )
    assert queue.worker.name not in _refusal(consumer, "SELECT pgmb.purge(%s)", "pushed")[1]


@pytest.mark.parametrize(
    "call",
    [
        "SELECT pgmb.delete('granted', %s::bigint[])",
        "SELECT pgmb.archive('granted', %s::bigint[])",
        "SELECT delivery_id FROM pgmb.set_vt('granted', %s::bigint[], 0)",
        "SELECT pgmb.nack('granted', %s::bigint[], ARRAY[1])",
    ],
)
def test_another_queues_delivery_ids_are_not_told_to_a_consumer(owner, login_role, call):
    _pull_queue(owner, "granted", "mine.#")
    _pull_queue(owner, "someone_elses", "theirs.#")
    other = pgmb.send("theirs.secret", {"n": 1})
    owner.execute("SELECT * FROM pgmb.read('someone_elses', 30, 1)")
    [theirs] = Delivery.objects.filter(message_id=other)
    name, consumer = login_role()
    access.grant_queue_access("granted", name)

    # The same answer as for an id that does not exist: nothing done, nothing said.
    missing = consumer.execute(call, [[theirs.id + 1_000_000]]).fetchall()
    assert consumer.execute(call, [[theirs.id]]).fetchall() == missing

    after = Delivery.objects.get(pk=theirs.id)
    assert (after.attempts, after.available_at) == (1, theirs.available_at)
    assert owner.execute("SELECT count(*) FROM pgmb_attempt").fetchone() == (0,)


def test_a_consumer_of_both_queues_is_still_told_of_a_mix_up(owner, login_role):
    _pull_queue(owner, "granted", "mine.#")
    _pull_queue(owner, "also_granted", "theirs.#")
    [theirs] = Delivery.objects.filter(message_id=pgmb.send("theirs.one", {}))
    name, consumer = login_role()
    access.grant_queue_access("granted", name)
    access.grant_queue_access("also_granted", name)

    assert _refusal(consumer, "SELECT pgmb.delete('granted', %s::bigint[])", [theirs.id]) == (
        "22023",
        f"messages {theirs.id} are not in queue 'granted'",
    )
