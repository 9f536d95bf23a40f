"""What one producing role's messages do to another's: nothing
(docs/decisions/0054-dedup-per-producing-role.md, 0055-dependencies-on-own-messages.md).

Issue 26: a producer that guessed another producer's ``dedup_id`` suppressed that later
message; ``depends_on`` told a role that publishes and consumes its own pull queue whether a
guessed message id existed and was pending. The roles are real login roles.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

import pgmb
from pgmb import access
from pgmb.models import Delivery, Message

pytestmark = pytest.mark.django_db(transaction=True)

DEDUP_SEND = (
    "SELECT pgmb.send(%s, 'order.created', %s::jsonb, NULL::jsonb, NULL::timestamptz,"
    " dedup_id => 'order-7')"
)
DEPENDENT_SEND = (
    "SELECT pgmb.send(%s, 'mine.job', '{}'::jsonb, NULL::jsonb, NULL::timestamptz,"
    " depends_on => ARRAY[%s]::uuid[])"
)


def _send(conn: psycopg.Connection, statement: str, *params: object) -> uuid.UUID:
    (answer,) = conn.execute(statement, params).fetchone()
    return answer


# ---- de-duplication ------------------------------------------------------------------


def test_a_dedup_id_guessed_by_another_producer_suppresses_nothing(make_queue, login_role):
    queue = make_queue("order.#", dedup_window=3600)
    _, attacker = login_role("pgmb_producer")
    _, victim = login_role("pgmb_producer")
    planted, theirs, again = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    _send(attacker, DEDUP_SEND, planted, '{"by": "attacker"}')
    _send(victim, DEDUP_SEND, theirs, '{"by": "victim"}')
    # Within one producing role de-duplication works as before: the resend is dropped.
    assert _send(victim, DEDUP_SEND, again, '{"by": "victim, resent"}') == again

    assert set(Message.objects.values_list("pk", flat=True)) == {planted, theirs}
    delivered = Delivery.objects.filter(queue=queue).values_list("message_id", flat=True)
    assert set(delivered) == {planted, theirs}


def test_the_applications_own_messages_are_a_scope_of_their_own(make_queue, login_role):
    make_queue("order.#", dedup_window=3600)
    _, producer = login_role("pgmb_producer")
    planted = uuid.uuid4()
    _send(producer, DEDUP_SEND, planted, "{}")

    first = pgmb.send("order.created", {"n": 1}, dedup_id="order-7")
    # The application's resend is dropped and it is told its own first message's id.
    assert first != planted
    assert pgmb.send("order.created", {"n": 2}, dedup_id="order-7") == first
    assert Message.objects.count() == 2


def test_a_message_records_the_role_that_published_it(owner, make_queue, login_role):
    make_queue("order.#")
    name, producer = login_role("pgmb_producer")
    sent = _send(producer, "SELECT pgmb.send(gen_random_uuid(), 'order.created', '{}')")
    mine = pgmb.send("order.created", {})
    rows = dict(owner.execute("SELECT id, producer::text FROM pgmb_message").fetchall())
    (me,) = owner.execute("SELECT session_user::text").fetchone()
    assert rows == {sent: name, mine: me}


# ---- dependencies --------------------------------------------------------------------


@pytest.fixture
def own_pull_queue(owner, login_role):
    """A role that publishes to a pull queue and consumes it."""
    owner.execute("SELECT pgmb.create('own', 'mine.#', 5, NULL)")
    name, conn = login_role("pgmb_producer")
    access.grant_queue_access("own", name)
    return conn


def _readable(conn: psycopg.Connection) -> set[uuid.UUID]:
    rows = conn.execute("SELECT message_id FROM pgmb.read('own', 0, 100)").fetchall()
    return {message_id for (message_id,) in rows}


def test_a_guessed_pending_id_and_an_unknown_one_look_the_same(own_pull_queue, make_queue):
    make_queue("other.#")
    pending = pgmb.send("other.thing", {"secret": True}, delay=3600)
    probe_pending, probe_unknown = uuid.uuid4(), uuid.uuid4()

    _send(own_pull_queue, DEPENDENT_SEND, probe_pending, pending)
    _send(own_pull_queue, DEPENDENT_SEND, probe_unknown, uuid.uuid4())

    # Both probes are due at once: neither waits for a message the role did not publish.
    assert _readable(own_pull_queue) == {probe_pending, probe_unknown}
    states = dict(Delivery.objects.filter(queue__name="own").values_list("message_id", "state"))
    assert states[probe_pending] == states[probe_unknown] != "waiting"
    # What is stored is what the role may depend on: nothing of the other message.
    assert Message.objects.get(pk=probe_pending).depends_on is None


def test_a_dependency_on_the_roles_own_message_still_waits(own_pull_queue):
    first, second = uuid.uuid4(), uuid.uuid4()
    _send(
        own_pull_queue,
        "SELECT pgmb.send(%s, 'mine.job', '{}'::jsonb, NULL::jsonb, now() + interval '1 hour')",
        first,
    )
    _send(own_pull_queue, DEPENDENT_SEND, second, first)

    assert _readable(own_pull_queue) == set()
    assert Delivery.objects.get(message_id=second).state == "waiting"
    assert Message.objects.get(pk=second).depends_on == [first]


def test_the_application_still_depends_on_any_message(make_queue):
    make_queue("#")
    other = pgmb.send("other.thing", {}, delay=3600)
    waiting = pgmb.send("mine.job", {}, depends_on=[other])
    assert Delivery.objects.get(message_id=waiting).state == "waiting"
