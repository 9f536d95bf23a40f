"""Wake-ups: a publishing transaction NOTIFYs only while some dispatcher waits for one
(pgmb.wake_dispatchers), and a dispatcher's waiting mark settles only once no message insert
is in flight (pgmb.dispatcher_idle), so no wake-up falls between its last claim and its sleep.

Every session here is its own autocommit connection: a NOTIFY is delivered at commit.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import psycopg
import pytest

from pgmb.db.conninfo import conninfo_from_django

MARKER = "marker"


@pytest.fixture
def connect(transactional_db) -> Iterator[Callable[..., psycopg.Connection]]:
    opened: list[psycopg.Connection] = []

    def open_one(**kw) -> psycopg.Connection:
        conn = psycopg.connect(**conninfo_from_django("default"), autocommit=True, **kw)
        opened.append(conn)
        return conn

    yield open_one
    for conn in opened:
        conn.close()


@pytest.fixture
def world(connect, make_queue):
    """A queue for order events, a listener, a publisher and a registered dispatcher."""
    make_queue("order.#")
    listener = connect()
    listener.execute("LISTEN pgmb")
    publisher = connect()
    dispatcher = connect()
    dispatcher_id = _register(dispatcher)
    # As a dispatcher's first claim that comes back full says: busy.
    dispatcher.execute("SELECT pgmb.dispatcher_busy(%s)", [dispatcher_id])
    return listener, publisher, dispatcher, dispatcher_id


def _register(conn: psycopg.Connection, kind: str = "external") -> int:
    (dispatcher_id,) = conn.execute(
        "SELECT pgmb.dispatcher_start(%s, 'test', %s)", [kind, os.getpid()]
    ).fetchone()
    return dispatcher_id


def _woken(listener: psycopg.Connection, connect) -> bool:
    """Whether pgmb's wake-up arrived since the last call: a marker notification is sent
    after what is being checked, and notifications arrive in commit order."""
    marker = connect()
    marker.execute(f"NOTIFY pgmb, '{MARKER}'")
    woken = False
    for note in listener.notifies(timeout=60):
        if note.payload == MARKER:
            return woken
        woken = True
    raise AssertionError("the marker notification never arrived")


def _send(conn: psycopg.Connection, key: str = "order.created") -> None:
    conn.execute("SELECT pgmb.send(pgmb.uuid_v7(), %s, '{}'::jsonb)", [key])


def test_no_notify_while_no_dispatcher_waits(world, connect):
    listener, publisher, _, _ = world
    _send(publisher)
    assert not _woken(listener, connect)


def test_a_dispatcher_that_never_said_is_woken_as_before(world, connect):
    """A dispatcher older than the mark (or one that has not claimed yet) never sets it."""
    listener, publisher, dispatcher, _ = world
    _register(dispatcher, "in_database")  # does not listen: never counted
    _send(publisher)
    assert not _woken(listener, connect)
    _register(dispatcher)
    _send(publisher)
    assert _woken(listener, connect)


def test_notify_once_a_dispatcher_waits_and_not_after_it_is_busy(world, connect):
    listener, publisher, dispatcher, dispatcher_id = world
    (settled,) = dispatcher.execute("SELECT pgmb.dispatcher_idle(%s)", [dispatcher_id]).fetchone()
    assert settled is True
    _send(publisher)
    assert _woken(listener, connect)
    _send(publisher, "user.created")  # routed nowhere: wakes nobody
    assert not _woken(listener, connect)
    dispatcher.execute("SELECT pgmb.dispatcher_busy(%s)", [dispatcher_id])
    _send(publisher)
    assert not _woken(listener, connect)


def test_one_notify_per_transaction(world, connect):
    listener, publisher, dispatcher, dispatcher_id = world
    dispatcher.execute("SELECT pgmb.dispatcher_idle(%s)", [dispatcher_id])
    with publisher.transaction():
        for _ in range(3):
            _send(publisher)
    marker = connect()
    marker.execute(f"NOTIFY pgmb, '{MARKER}'")
    payloads = []
    for note in listener.notifies(timeout=60):
        payloads.append(note.payload)
        if note.payload == MARKER:
            break
    assert payloads == ["", MARKER]


def test_the_mark_settles_only_once_no_insert_is_in_flight(world, connect):
    """The race: a publisher that checked for waiting dispatchers before the mark, and
    commits after the dispatcher's last claim, would be neither claimed nor heard."""
    listener, publisher, dispatcher, dispatcher_id = world
    tx = publisher.transaction()
    tx.__enter__()
    _send(publisher)  # checked: nobody waits, so no NOTIFY at its commit
    idle = "SELECT pgmb.dispatcher_idle(%s)"
    assert dispatcher.execute(idle, [dispatcher_id]).fetchone() == (False,)
    # Marked all the same: publishers from now on notify.
    assert dispatcher.execute(
        "SELECT waiting FROM pgmb_dispatcher WHERE id = %s", [dispatcher_id]
    ).fetchone() == (True,)
    other = connect()
    _send(other)
    assert _woken(listener, connect)
    tx.__exit__(None, None, None)
    assert not _woken(listener, connect)  # the early publisher's commit: no NOTIFY
    # Settled now, and a claim after it sees the early publisher's message.
    assert dispatcher.execute(idle, [dispatcher_id]).fetchone() == (True,)
    (ready,) = dispatcher.execute("SELECT count(*) FROM pgmb_delivery").fetchone()
    assert ready == 2


def test_an_aborted_insert_does_not_keep_the_mark_unsettled(world):
    _, publisher, dispatcher, dispatcher_id = world
    with pytest.raises(psycopg.errors.RaiseException), publisher.transaction():
        _send(publisher)
        publisher.execute("DO $$ BEGIN RAISE EXCEPTION 'changed my mind'; END $$")
    idle = "SELECT pgmb.dispatcher_idle(%s)"
    assert dispatcher.execute(idle, [dispatcher_id]).fetchone() == (True,)


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
def test_snapshot_isolation_publishers_always_notify(world, connect, level):
    """Their check would read the transaction's first snapshot, older than the mark."""
    listener, publisher, _, _ = world
    publisher.execute(f"SET default_transaction_isolation = '{level}'")
    _send(publisher)
    assert _woken(listener, connect)


def test_marks_of_stopped_and_gone_dispatchers_do_not_count(world, connect):
    listener, publisher, dispatcher, dispatcher_id = world
    dispatcher.execute("SELECT pgmb.dispatcher_idle(%s)", [dispatcher_id])
    dispatcher.execute(
        "UPDATE pgmb_dispatcher SET heartbeat_at = now() - interval '61 s' WHERE id = %s",
        [dispatcher_id],
    )
    _send(publisher)
    assert not _woken(listener, connect)  # killed while waiting: gone
    dispatcher.execute("SELECT pgmb.dispatcher_beat(%s, 0, 0, 0)", [dispatcher_id])
    _send(publisher)
    assert _woken(listener, connect)
    dispatcher.execute("SELECT pgmb.dispatcher_stop(%s, 0, 0)", [dispatcher_id])
    assert dispatcher.execute(
        "SELECT waiting FROM pgmb_dispatcher WHERE id = %s", [dispatcher_id]
    ).fetchone() == (False,)
    _send(publisher)
    assert not _woken(listener, connect)


def test_notify_off_never_notifies(world, connect):
    listener, publisher, dispatcher, dispatcher_id = world
    dispatcher.execute("SELECT pgmb.dispatcher_idle(%s)", [dispatcher_id])
    publisher.execute("SET pgmb.notify = off")
    _send(publisher)
    assert not _woken(listener, connect)
