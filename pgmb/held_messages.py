"""The messages a consumer has read and not yet settled, kept invisible while it works.

A read hides a pull message for its visibility timeout (``vt``); a handler that runs longer
would let another reader take it and run it a second time, at once. :class:`HeldMessages`
prevents that: while a consumer holds messages, a background thread moves their timeout
to ``now + vt`` every third of ``vt`` (``pgmb.set_vt``), on a connection of its own, since
the consumer's thread is busy in the handler. Nothing extends them once the process dies:
they come back after at most one ``vt``.

The same thread keeps the consumer's heartbeat going while it holds messages (the
consumer's own loop beats only between handlers): a handler that runs for minutes must not
make the consumer look gone in the admin.

The thread connects the first time something is held that long, so consumers whose
handlers are quick never open the second connection. Its connection shows in
``pg_stat_activity`` as :data:`APPLICATION_NAME` unless the database settings name one.

An extension that fails (a lost connection, a queue deleted meanwhile) is logged and tried
again shortly; a message that is no longer there (settled or dead-lettered by another
client) or that was read again by someone else is logged and let go. Neither ever reaches
the handler or the consumer's loop.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

from .db import pooler
from .db.backoff import Backoff
from .db.error_text import first_line
from .db.statements import Call, run_on
from .pull import Message, set_vt_call

log = logging.getLogger("pgmb.consume")

#: Extensions come this fraction of the visibility timeout apart: two may be missed (a
#: loaded machine, a reconnection) before a message shows again.
EXTEND_EVERY = 1 / 3
#: The shortest time between two extensions, in seconds (a tiny vt must not spin).
MIN_INTERVAL = 0.05
#: How long :meth:`HeldMessages.close` waits for an extension in flight, in seconds.
CLOSE_WAIT = 5.0
APPLICATION_NAME = "pgmb held messages"


class HeldMessages:
    """What one consumer holds of pull queue ``queue``, read with visibility timeout ``vt``.

    :meth:`hold` the messages of a read before handling them, :meth:`release` them before
    deleting, nacking or handing them back: after :meth:`release` returns, no extension of
    them is in flight or to come, so it cannot undo a nack's backoff or a hand-back.
    """

    def __init__(
        self,
        queue: str,
        vt: float,
        conninfo: dict[str, Any],
        beat: Callable[[int], Call[bool] | None] | None = None,
        beat_every: float = 0.0,
    ) -> None:
        """``beat(held)`` gives the consumer's heartbeat statement (None while it is not
        registered), run every ``beat_every`` seconds while messages are held."""
        self.queue = queue
        self.vt = vt
        self.interval = max(vt * EXTEND_EVERY, MIN_INTERVAL)
        self._beat = beat
        self._beat_every = max(beat_every, MIN_INTERVAL)
        self._conninfo = {"application_name": APPLICATION_NAME, **conninfo}
        #: Guards everything below; held during an extension's statement, so that
        #: :meth:`release` waits for one in flight.
        self._lock = threading.Condition()
        self._held: dict[int, Message] = {}
        #: When the next extension is due (time.monotonic()).
        self._due = 0.0
        #: When the next heartbeat is due, while something is held.
        self._beat_due = 0.0
        self._closing = False
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._backoff = Backoff()
        self._failing = False

    def hold(self, messages: Iterable[Message]) -> None:
        """Keep ``messages`` (just read) invisible until they are released."""
        with self._lock:
            if self._closing or self.vt <= 0:
                return
            if not self._held:
                self._due = time.monotonic() + self.interval
                self._beat_due = time.monotonic() + self._beat_every
            self._held.update((m.id, m) for m in messages)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"pgmb-held-{self.queue}", daemon=True
                )
                self._thread.start()
            self._lock.notify()

    def release(self, messages: Iterable[Message]) -> None:
        """Stop extending ``messages``; waits for an extension in flight to end."""
        with self._lock:
            for message in messages:
                self._held.pop(message.id, None)

    def close(self) -> None:
        """Stop the thread and close its connection (what is held is let go)."""
        with self._lock:
            self._closing = True
            self._held.clear()
            self._lock.notify()
        thread = self._thread
        if thread is not None:
            thread.join(CLOSE_WAIT)
            if thread.is_alive():
                # Stuck in a statement on a dead network: a daemon thread, it ends with
                # the process; its connection is left to it.
                log.warning("the extension thread of %s did not stop in time", self.queue)
                return
        self._drop()

    def _next(self) -> float:
        """When the thread next has something to do (called with the lock held)."""
        return min(self._due, self._beat_due) if self._beat else self._due

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closing and (not self._held or time.monotonic() < self._next()):
                    self._lock.wait(
                        None if not self._held else max(0.0, self._next() - time.monotonic())
                    )
                if self._closing:
                    return
                beat_due = self._beat is not None and time.monotonic() >= self._beat_due
                extension_due = time.monotonic() >= self._due
            try:
                if beat_due:
                    self._heartbeat()
                if extension_due:
                    self._extend()
            except Exception as exc:  # the thread is the guard: it must outlive any error
                self._failed(exc)

    def _heartbeat(self) -> None:
        assert self._beat is not None
        with self._lock:
            self._beat_due = time.monotonic() + self._beat_every
            call = self._beat(len(self._held))
        if call is not None:
            run_on(self._connection(), call)

    def _extend(self) -> None:
        conn = self._connection()
        with self._lock:
            held = list(self._held.values())
            if not held:
                return
            kept = run_on(conn, set_vt_call(self.queue, held, self.vt))
            self._due = time.monotonic() + self.interval
            self._forget_lost(held, {m.id: m for m in kept})
        if self._failing:
            self._failing = False
            self._backoff.reset()
            log.info("extending the visibility timeouts of %s again", self.queue)
        log.debug("extended %d messages of %s by %gs", len(kept), self.queue, self.vt)

    def _forget_lost(self, held: list[Message], kept: dict[int, Message]) -> None:
        """Let go of what the extension did not find as this consumer read it (called with
        the lock held)."""
        for message in held:
            now = kept.get(message.id)
            if now is None:
                why = "it is no longer in the queue (settled or dead-lettered elsewhere)"
            elif now.read_ct != message.read_ct:
                why = "another reader has read it since (its visibility timeout ran out)"
            else:
                continue
            log.warning(
                "message %s of %s is not kept invisible any more: %s",
                message.id,
                self.queue,
                why,
            )
            self._held.pop(message.id, None)

    def _failed(self, exc: Exception) -> None:
        if isinstance(exc, psycopg.OperationalError):
            self._drop()
        level = logging.DEBUG if self._failing else logging.WARNING
        if not isinstance(exc, psycopg.Error):
            level = logging.ERROR
        log.log(
            level,
            "could not extend the visibility timeouts of %s (%s: %s): trying again",
            self.queue,
            type(exc).__name__,
            first_line(exc),
            exc_info=not isinstance(exc, psycopg.Error),
        )
        self._failing = True
        with self._lock:
            self._due = time.monotonic() + min(self._backoff.next(), self.interval)
            self._beat_due = max(self._beat_due, self._due)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = pooler.connect(self._conninfo)
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):  # already broken
                conn.close()
