"""The dispatcher's outcomes on their way to the database: start marks, acks and failures,
written in small batches by a task of their own, on a connection of their own.

So a slow or failing request never delays or rolls back the record of another; and a
statement the database refuses as a whole is written again part by part, so that a bad
row costs only itself (its lease expires and it is tried again).

The dispatch loop appends to :attr:`OutcomeWriter.acks`, :attr:`~OutcomeWriter.fails`
and :attr:`~OutcomeWriter.starts` directly (they are its own, shared, containers: no call
per delivery) and sets :attr:`~OutcomeWriter.ready`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

from .. import deliveries
from ..db.reconnecting import Database, Unavailable
from ..db.statements import Call
from ..deliveries import Claimed, Failure, Success

log = logging.getLogger("pgmb.dispatch")
T = TypeVar("T")

#: Seconds outcomes wait for others to be written with them, when there are few: at low
#: rates this turns one query per delivery into one per few deliveries, for little delay.
FLUSH_LINGER = 0.005


class OutcomeWriter:
    """Outcomes recorded and not written yet, and the task that writes them."""

    def __init__(self, db: Database, batch: int) -> None:
        self.db = db
        self._batch = batch
        self.acks: list[Success] = []
        self.fails: list[Failure] = []
        #: Rows whose request has started and whose start mark is not written yet, by
        #: delivery id (an outcome written first makes the mark needless).
        self.starts: dict[int, Claimed] = {}
        #: Set when there is something to write (or once closing).
        self.ready = asyncio.Event()
        self._closing = False

    def unflushed(self) -> bool:
        return bool(self.acks or self.fails or self.starts)

    def close(self) -> None:
        """Write what is left, then let :meth:`run` end."""
        self._closing = True
        self.ready.set()

    async def run(self, wake: asyncio.Event, wake_when_idle: Callable[[], bool]) -> None:
        """Write outcomes as they come; after :meth:`close`, write the rest and end.

        ``wake`` is set when retries were written (the loop's next wake-up may come
        sooner) or when ``wake_when_idle()`` says the loop may be done; not after every
        batch of acks.
        """
        while True:
            await self.ready.wait()
            # Start marks wait as long: a crash within that time forgives at most their
            # expiry (pgmb.reclaim_expired), while a write of their own would cost a round
            # trip where most would have come with an outcome anyway.
            if not self._closing and len(self.acks) + len(self.fails) < self._batch:
                await asyncio.sleep(FLUSH_LINGER)
            self.ready.clear()
            if await self.flush() or wake_when_idle():
                wake.set()
            if self._closing and not self.unflushed():
                return

    async def flush(self) -> bool:
        """Write the start marks and outcomes recorded so far, in one statement; whether
        failures (now retries) were written."""
        # Taken off the lists only once written: a flush that fails leaves them for the next.
        starts, acks, fails = list(self.starts.values()), self.acks[:], self.fails[:]
        if not (starts or acks or fails):
            return False
        try:
            await self.db.run(deliveries.record_call(starts, acks, fails))
        except Unavailable:
            raise
        except Exception:  # refused as a whole: each part alone, so a bad row costs only itself
            await self.write(deliveries.start_call, starts)
            await self.write(deliveries.ack_call, acks)
            await self.write(deliveries.fail_call, fails)
        for row in starts:
            # The same delivery may have been claimed and started again meanwhile.
            if self.starts.get(row.delivery_id) is row:
                del self.starts[row.delivery_id]
        del self.acks[: len(acks)]
        del self.fails[: len(fails)]
        return bool(fails)

    async def write(self, call: Callable[[list[T]], Call[int]], items: list[T]) -> None:
        """Write outcomes; one the database refuses is left to its lease, not the batch."""
        if not items:
            return
        try:
            await self.db.run(call(items))
        except Unavailable:
            raise
        except Exception as exc:  # refused, not unreachable (Database.run retries that)
            if len(items) > 1:
                for item in items:
                    await self.write(call, [item])
                return
            log.error(
                "could not record an outcome (%s: %s); the delivery's lease will expire and "
                "it will be tried again: %r",
                type(exc).__name__,
                str(exc).strip(),
                items[0],
            )
