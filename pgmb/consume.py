"""A pull queue's consumer: read, call a handler, delete or nack, until stopped.

``manage.py pgmb_consume`` runs one :class:`Consumer`. It reads on a connection of its
own (autocommit), so that it can wait for publishers' notifications: it registers as a
dispatcher of kind ``consumer`` (shown with the dispatchers), and when a read comes back
empty it marks itself waiting, so that publishers notify (``pgmb.wake_dispatchers``),
with the same no-lost-wake-up handshake as the external dispatcher
(``pgmb.dispatcher_idle``, docs/decisions/0008-wake-ups-only-for-waiting-dispatchers.md).
It also wakes when a message's visibility timeout or backoff runs out (``pgmb.pull_next_visible``).
Through a transaction pooler (:mod:`pgmb.db.pooler`) it LISTENs on a connection of the
alias ``PGMB["DIRECT_DATABASES"]`` gives, or, without one, says when it connects that it
polls every ``poll_interval`` seconds.

While it holds messages (read, not yet deleted or failed), a thread of its own extends
their visibility timeout (:class:`pgmb.held_messages.HeldMessages`), so that a handler that
runs longer than the timeout does not let another consumer read them meanwhile.

A database that cannot be reached is waited out, at the start as after a lost connection
(a restart, a terminated backend): the consumer tries again with the dispatcher's backoff
(at most half a second apart) and registers again; messages read but not yet deleted
become visible again at the end of their visibility timeout, as after a crash. Errors on a
working connection (an unknown queue, a push queue) are raised.

The handler gets one :class:`pgmb.pull.Message` (the default) or, with ``batch``, a list
of up to ``batch`` of them. It returns: the messages are deleted (acknowledged). It raises:
they are failed (``pgmb.nack``: visible again after the queue's backoff, dead-lettered
after ``1 + max_retries`` reads), and the loop goes on.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from . import conf, dispatcher_registry, sql, tracing
from .db import pooler
from .db.backoff import Backoff
from .db.conninfo import conninfo_from_django, direct_conninfo
from .db.reconnecting import WARN_EVERY
from .db.statements import Call, run_on
from .held_messages import HeldMessages
from .pull import (
    Message,
    delete_call,
    nack_call,
    next_visible_call,
    queue_lease_call,
    read_call,
    set_vt_call,
)

log = logging.getLogger("pgmb.consume")

#: Messages read at once when the handler takes them one by one.
PREFETCH = 10
#: The shortest sleep of an idle consumer, in seconds.
MIN_SLEEP = 0.01


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Unreachable(Exception):
    """A connection could not be opened, or broke while being set up: worth waiting out."""

    def __init__(self, error: psycopg.OperationalError) -> None:
        super().__init__(str(error))
        self.error = error


class Consumer:
    """Consumes one pull queue until :meth:`stop` is called (a signal handler may)."""

    def __init__(
        self,
        queue: str,
        handler: Callable[[Any], Any],
        *,
        batch: int | None = None,
        vt: float | None = None,
        using: str | None = None,
        max_messages: int | None = None,
        poll_interval: float | None = None,
    ) -> None:
        self.queue = queue
        self.handler = handler
        self.batch = batch
        self.qty = batch or PREFETCH
        self.vt = vt
        self.using = using or conf.get().DATABASE
        self.max_messages = max_messages
        self.heartbeat = conf.get().DISPATCH_HEARTBEAT_INTERVAL
        #: The longest sleep without a notification (a safety net: publishers notify).
        self.poll_interval = poll_interval or conf.get().DISPATCH_POLL_INTERVAL
        self.stopping = False
        self.deleted = 0
        self.failed = 0
        self.registration: int | None = None
        #: The consumer's row says it waits (publishers notify), and whether every
        #: publisher sees that (pgmb.dispatcher_idle): then it may sleep.
        self._waiting = False
        self._settled = False
        self._conn: psycopg.Connection[Any] | None = None
        #: Whether it was said that LISTEN is unavailable (once a process, not each connection).
        self._said_polling = False
        #: Through a pooler, the connection to the same database without it that LISTENs
        #: (PGMB["DIRECT_DATABASES"]); None: the reading connection listens, or none does.
        self._listener: psycopg.Connection[Any] | None = None
        #: No connection LISTENs (through a pooler, without a direct alias): the consumer
        #: polls, and its row never says it waits (publishers need not NOTIFY it).
        self._polling = False
        self._next_beat = 0.0
        #: Created on the first connection, once the visibility timeout is known.
        self._held: HeldMessages | None = None

    def stop(self) -> None:
        """Stop after the messages in hand: safe to call from a signal handler."""
        self.stopping = True

    def connect(self) -> psycopg.Connection[Any]:
        """Connect and register once; raises the psycopg error of a failure."""
        try:
            return self._open()
        except _Unreachable as exc:
            raise exc.error from None

    def connect_waiting(self) -> psycopg.Connection[Any] | None:
        """:meth:`connect`, waiting for a database that does not accept connections yet
        (with the reconnection's backoff); None if stopped first. Errors on a working
        connection (an unknown queue, a push queue) are raised at once."""
        return self._wait_for_connection(reconnecting=False)

    def _open(self) -> psycopg.Connection[Any]:
        conninfo = conninfo_from_django(self.using)
        try:
            conn = pooler.connect(conninfo)
        except psycopg.OperationalError as exc:
            raise _Unreachable(exc) from exc
        try:
            self._listen(conn)
            # Checks the queue (unknown, or not a pull queue: an error) and gives the
            # default visibility timeout, the queue's lease.
            lease = run_on(conn, queue_lease_call(self.queue))
            if self.vt is None:
                self.vt = float(lease)
            self.registration = run_on(
                conn,
                dispatcher_registry.start_call(
                    dispatcher_registry.CONSUMER, socket.gethostname(), os.getpid(), [self.queue]
                ),
            )
            if self._polling:
                # A new row counts as waiting until it says otherwise.
                run_on(conn, dispatcher_registry.busy_call(self.registration))
        except psycopg.OperationalError as exc:
            broken = conn.broken or conn.closed
            conn.close()
            if broken:
                raise _Unreachable(exc) from exc
            raise
        except BaseException:
            conn.close()
            raise
        if self._held is None:
            self._held = HeldMessages(
                self.queue, self.vt or 0, conninfo, self._beat_call, self.heartbeat
            )
        self._waiting = self._settled = False
        self._next_beat = time.monotonic() + self.heartbeat
        self._conn = conn
        return conn

    def _listen(self, conn: pooler.PoolerAwareConnection) -> None:
        """LISTEN on ``conn``; through a pooler, where a LISTEN would stay with a server
        connection the pooler hands to others, on a connection of the alias
        ``PGMB["DIRECT_DATABASES"]`` gives, or nowhere: then the consumer polls, and says so
        once."""
        self._drop_listener()
        self._polling = False
        listen = sql.query("dispatcher.sql", "listen")
        if not conn.pooled:
            conn.execute(listen)
            return
        direct = direct_conninfo(self.using)
        if direct is not None:
            try:
                listener = pooler.connect(direct)
            except psycopg.OperationalError as exc:
                raise _Unreachable(exc) from exc
            try:
                if not listener.pooled:
                    listener.execute(listen)
                    self._listener = listener
                    return
            except psycopg.OperationalError as exc:
                raise _Unreachable(exc) from exc
            finally:
                if self._listener is not listener:
                    listener.close()
        self._polling = True
        if not self._said_polling:
            log.warning(
                "%s: polling %s every %gs instead (PGMB['DISPATCH_POLL_INTERVAL'])",
                pooler.NO_LISTEN,
                self.queue,
                self.poll_interval,
            )
            self._said_polling = True

    def _drop_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    def _lost(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether the reading connection or the listening one is gone."""
        return any(c.closed or c.broken for c in (conn, self._listener) if c is not None)

    def run(self) -> None:
        """Consume until stopped (or until ``max_messages`` were handled)."""
        conn = self._conn or self.connect()
        try:
            while not self.stopping and not self._done():
                try:
                    self._step(conn)
                except psycopg.OperationalError as exc:
                    if not self._lost(conn):
                        raise
                    again = self._reconnect(exc)
                    if again is None:
                        return
                    conn = again
        finally:
            self.close()

    def _step(self, conn: psycopg.Connection[Any]) -> None:
        self._beat(conn)
        messages = run_on(conn, self.read_call(self._qty()))
        if messages:
            self._busy(conn, len(messages))
            self._handle(conn, messages)
        else:
            self._wait(conn)

    def _reconnect(self, lost: psycopg.Error) -> psycopg.Connection[Any] | None:
        """Connect again after ``lost``; None if stopped meanwhile. The old registration
        is left to age into "gone" (its connection is what failed)."""
        log.warning("connection to the database lost (%s): reconnecting", _error_text(lost))
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._drop_listener()
        self.registration = None
        return self._wait_for_connection(reconnecting=True)

    def _wait_for_connection(self, *, reconnecting: bool) -> psycopg.Connection[Any] | None:
        """Connect, trying again until the database answers or the consumer is stopped
        (None). A first connection tries at once, a reconnection after a first wait."""
        backoff = Backoff()
        warned_at: float | None = None
        attempts = 0
        while not self.stopping:
            if reconnecting or attempts:
                time.sleep(backoff.next())
            attempts += 1
            try:
                conn = self._open()
            except _Unreachable as exc:
                now = time.monotonic()
                if warned_at is None or now - warned_at >= WARN_EVERY:
                    warned_at = now
                    log.warning(
                        "cannot reach the database (%s): trying again", _error_text(exc.error)
                    )
                else:
                    log.debug("database still unreachable: %s", _error_text(exc.error))
                continue
            if reconnecting:
                log.warning("reconnected to the database")
            elif attempts > 1:
                log.warning("reached the database")
            return conn
        return None

    def close(self) -> None:
        if self._held is not None:
            self._held.close()
        self._drop_listener()
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if self.registration is not None:
                run_on(
                    conn,
                    dispatcher_registry.stop_call(self.registration, self.deleted, self.failed),
                )
        except psycopg.Error as exc:
            log.warning("could not mark the consumer stopped: %s", exc)
        finally:
            conn.close()

    def _done(self) -> bool:
        return self.max_messages is not None and self.deleted + self.failed >= self.max_messages

    def _qty(self) -> int:
        if self.max_messages is None:
            return self.qty
        return max(1, min(self.qty, self.max_messages - self.deleted - self.failed))

    def _beat_call(self, held: int) -> Call[bool] | None:
        """The heartbeat the held messages' thread sends while a handler runs."""
        registration = self.registration
        if registration is None:
            return None
        return dispatcher_registry.beat_call(registration, held, self.deleted, self.failed)

    def _beat(self, conn: psycopg.Connection[Any]) -> None:
        if time.monotonic() < self._next_beat or self.registration is None:
            return
        self._next_beat = time.monotonic() + self.heartbeat
        run_on(conn, dispatcher_registry.beat_call(self.registration, 0, self.deleted, self.failed))

    def _busy(self, conn: psycopg.Connection[Any], got: int) -> None:
        # Publishers need not wake a consumer that reads full batches.
        if self._waiting and got >= self._qty() and self.registration is not None:
            run_on(conn, dispatcher_registry.busy_call(self.registration))
            self._waiting = self._settled = False

    def _handle(self, conn: psycopg.Connection[Any], messages: list[Message]) -> None:
        groups: Sequence[list[Message]] = (
            [messages] if self.batch else [[message] for message in messages]
        )
        done: list[Message] = []
        failed: list[tuple[Message, str]] = []
        rest: list[Message] = []
        assert self._held is not None  # set by the connection that read them
        self._held.hold(messages)
        try:
            for i, group in enumerate(groups):
                if self.stopping and i > 0:
                    rest = [m for g in groups[i:] for m in g]
                    break
                try:
                    with tracing.consume_span(self.queue, group):
                        self.handler(group if self.batch else group[0])
                except (Exception, SystemExit) as exc:  # fails its messages, never the loop
                    log.warning(
                        "handler failed on %s of %s: %s",
                        ", ".join(str(m.id) for m in group),
                        self.queue,
                        _error_text(exc),
                    )
                    failed += [(m, _error_text(exc)) for m in group]
                else:
                    done += group
        finally:
            # Before settling: an extension after a nack or a hand-back would undo it.
            self._held.release(messages)
        if rest:
            # Stopping: what was read and not handled is visible again at once.
            run_on(conn, set_vt_call(self.queue, rest, 0))
        if done:
            self.deleted += self.settle_handled(conn, done)
        if failed:
            run_on(
                conn,
                nack_call(self.queue, [m for m, _ in failed], [e for _, e in failed]),
            )
            self.failed += len(failed)

    def read_call(self, qty: int) -> Call[list[Message]]:
        """The statement that reads the next batch of up to ``qty`` messages. A subclass
        may read with a statement that does more in the same round trip."""
        return read_call(self.queue, self.vt or 0, qty)

    def settle_handled(self, conn: psycopg.Connection[Any], done: list[Message]) -> int:
        """Acknowledge the messages the handler returned on, after each batch (a stop
        included); how many were deleted. A subclass whose handler defers recording its
        outcomes records them here first."""
        return len(run_on(conn, delete_call(self.queue, done)))

    def _wait(self, conn: psycopg.Connection[Any]) -> None:
        """Nothing to read: mark this consumer waiting and read once more; with the mark
        visible to every publisher, sleep until a notification, the next visible message
        or the poll interval (heartbeats go on meanwhile; they do not end the wait). A
        consumer that polls (no LISTEN) sleeps at once, unmarked."""
        if not self._settled and self.registration is not None and not self._polling:
            self._waiting = True
            self._settled = run_on(conn, dispatcher_registry.idle_call(self.registration))
            if not self._settled:
                # A message insert was in flight: it may not have seen the mark. Read again
                # shortly and ask once more.
                time.sleep(random.uniform(0.002, 0.05))  # noqa: S311 (jitter)
            return
        due = run_on(conn, next_visible_call(self.queue))
        # A visible message the read did not get is another reader's, being read right
        # now: a short pause, not a busy loop.
        self._sleep(
            conn,
            self.poll_interval if due is None else min(max(due, MIN_SLEEP), self.poll_interval),
        )

    def _sleep(self, conn: psycopg.Connection[Any], timeout: float) -> None:
        # In short slices, so that a stop request is seen within a fraction of a second.
        # A notification that came during an earlier statement is kept by psycopg and
        # ends the sleep at once.
        deadline = time.monotonic() + timeout
        while not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for _ in (self._listener or conn).notifies(timeout=min(left, 0.25), stop_after=1):
                return
            self._beat(conn)
