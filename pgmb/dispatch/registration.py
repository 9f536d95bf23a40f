"""A dispatcher's row in pgmb_dispatcher, as the dispatch loop keeps it: registered,
heartbeats with the counters, the waiting mark publishers read, and the stop.

None of it is ever a reason to stop delivering: an outage is waited out as for a claim
(``Database.run``), and anything the database refuses is logged and tried again later.
"""

from __future__ import annotations

import logging
import os
import socket

from .. import dispatcher_registry
from ..db.backoff import Backoff
from ..db.error_text import first_line
from ..db.reconnecting import Database, Unavailable

log = logging.getLogger("pgmb.dispatch")

#: Seconds between attempts to settle the waiting mark while message inserts are in
#: flight: the first wait and the longest (a publisher's transaction that stays open keeps
#: it from settling; its message is claimed at most this long after it commits).
SETTLE_FIRST = 0.002
SETTLE_CAP = 0.1


class Registration:
    """One dispatcher's row, on the claims' connection."""

    def __init__(self, db: Database, queues: list[str] | None, poll_interval: float) -> None:
        self._db = db
        self._queues = queues
        self._poll_interval = poll_interval
        #: The row's id, once registered.
        self.id: int | None = None
        #: Whether the row is marked waiting (publishers NOTIFY only then; None: not said
        #: yet, and woken as if waiting), and whether the mark is settled: every publisher
        #: since sees it. A claim that comes back full clears both (pgmb.dispatcher_idle
        #: and _busy, pgmb/sql/schema/dispatchers.sql).
        self._waiting: bool | None = None
        self.settled = False
        #: Waits while a message insert in flight keeps the mark from settling.
        self._settling = Backoff(first=SETTLE_FIRST, cap=SETTLE_CAP)

    async def beat(self, in_flight: int, delivered: int, failed: int) -> None:
        """Register, or record a heartbeat with the counters (register again if the row
        went: removed by maintenance after a long outage)."""
        try:
            if self.id is not None and await self._db.run(
                dispatcher_registry.beat_call(self.id, in_flight, delivered, failed)
            ):
                return
            self.id = await self._db.run(
                dispatcher_registry.start_call(
                    dispatcher_registry.EXTERNAL, socket.gethostname(), os.getpid(), self._queues
                )
            )
            self._waiting, self.settled = None, False  # a new row: not said yet
            log.info("registered as dispatcher id=%d", self.id)
        except Unavailable:
            raise
        except Exception as exc:
            log.error(
                "could not record a heartbeat (%s: %s); trying again later",
                type(exc).__name__,
                first_line(exc),
            )

    async def mark_idle(self) -> float:
        """Mark the dispatcher waiting before it sleeps. Returns 0 once the mark is
        settled (claim once more, then sleep until woken), or the seconds within which to
        claim again and try to settle it (a publisher's insert was in flight, and both its
        message and its NOTIFY may be missed otherwise). Unregistered, or refused by the
        database: the poll interval.
        """
        if self.id is None:
            return self._poll_interval
        try:
            settled = await self._db.run(dispatcher_registry.idle_call(self.id))
        except Unavailable:
            raise
        except Exception as exc:
            log.error("could not mark the dispatcher waiting (%s: %s)", type(exc).__name__, exc)
            return self._poll_interval
        self._waiting = True
        if settled:
            self.settled = True
            self._settling.reset()
            return 0.0
        return self._settling.next()

    async def mark_busy(self) -> None:
        """A claim came back full: the loop claims again by itself, so publishers need not
        wake it (one write per busy spell, none while the mark is already clear)."""
        if self._waiting is not False and self.id is not None:
            try:
                await self._db.run(dispatcher_registry.busy_call(self.id))
            except Unavailable:
                raise
            except Exception as exc:
                log.error(
                    "could not clear the dispatcher's waiting mark (%s: %s)",
                    type(exc).__name__,
                    exc,
                )
                return
        self._waiting = self.settled = False

    async def stop(self, delivered: int, failed: int) -> None:
        """Mark the dispatcher stopped (best effort: if the database is away it will be
        shown as gone instead)."""
        if self.id is None:
            return
        try:
            await self._db.run(dispatcher_registry.stop_call(self.id, delivered, failed))
        except Exception as exc:
            log.warning(
                "could not mark dispatcher id=%d stopped (%s: %s)",
                self.id,
                type(exc).__name__,
                first_line(exc),
            )
