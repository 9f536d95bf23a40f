"""The dispatcher's housekeeping: once it has drained its work, a vacuum of pgmb_delivery
and a look at its indexes (:mod:`pgmb.housekeeping`), in the background.

Housekeeping runs beside the loop, on a connection of its own: a rebuild takes seconds to
minutes and must not hold back claims. Failures and reports are logged, never raised.
Through a transaction pooler housekeeping cannot run (:class:`pgmb.housekeeping.ThroughPooler`):
the first try says so, and there is no other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from .. import housekeeping
from ..db.error_text import first_line
from ..housekeeping import Thresholds

log = logging.getLogger("pgmb.dispatch")


class Housekeeper:
    """When to vacuum and when to look, and the one task doing either."""

    def __init__(
        self,
        conninfo: dict[str, Any],
        vacuum_every: int,
        interval: float,
        thresholds: Thresholds,
    ) -> None:
        self._conninfo = conninfo
        self._vacuum_every = vacuum_every
        self._interval = interval
        self._thresholds = thresholds
        self._task: asyncio.Task | None = None
        #: Next look: once due, and only if something was claimed since the last.
        self._due = 0.0
        self._looked_at_claims = 0
        #: Deliveries claimed when the last vacuum was started.
        self._vacuumed_at_claims = 0
        #: The database connection goes through a pooler: no housekeeping from here.
        self._off = False

    def start_if_due(self, claimed: int) -> bool:
        """The dispatcher has drained its work (``claimed`` deliveries so far): start, in
        the background, a vacuum of pgmb_delivery if ``vacuum_every`` deliveries were
        claimed since the last, and a look at its indexes if the interval since the last
        look has passed (never two at once). Whether it started anything.

        Vacuuming once drained, not mid-way: the finished deliveries' rows and index
        entries, which every claim walks past, are then all gone, and the emptied pages
        are truncated. (The SQL in pgmb/sql/ keeps the claims' plans right whatever
        statistics a vacuum records.)
        """
        now = time.monotonic()
        every, interval = self._vacuum_every, self._interval
        vacuum = bool(every) and claimed - self._vacuumed_at_claims >= every
        look = bool(interval) and claimed != self._looked_at_claims and now >= self._due
        busy = self._task is not None and not self._task.done()
        if self._off or not (vacuum or look) or busy:
            return False
        if vacuum:
            self._vacuumed_at_claims = claimed
        if look:
            self._due = now + interval
            self._looked_at_claims = claimed
        self._task = asyncio.create_task(self._run(vacuum, look, claimed))
        return True

    async def wait(self) -> None:
        """Let what was started finish (what was drained is tidied before an exit)."""
        if self._task is not None:
            await self._task

    async def cancel(self) -> None:
        """Stop what runs; psycopg cancels the statement in the server: an interrupted
        rebuild leaves an invalid index, which the next housekeeping drops."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _through_pooler(self, exc: housekeeping.ThroughPooler) -> None:
        self._off = True
        log.warning("no housekeeping from this dispatcher: %s", exc)

    async def _vacuum(self, claimed: int) -> bool:
        """Vacuum; False if housekeeping is off (through a pooler)."""
        try:
            done = await housekeeping.avacuum(self._conninfo)
        except housekeeping.ThroughPooler as exc:
            self._through_pooler(exc)
            return False
        except Exception as exc:
            log.warning(
                "could not vacuum pgmb_delivery (%s); next try after %d more claims",
                first_line(exc),
                self._vacuum_every,
            )
            return True
        if done:
            log.debug("vacuumed pgmb_delivery claims=%d", claimed)
        else:
            log.debug("vacuum skipped: another process holds the housekeeping lock")
        return True

    async def _run(self, vacuum: bool, look: bool, claimed: int) -> None:
        if vacuum and not await self._vacuum(claimed):
            return
        if not look:
            return
        try:
            report = await housekeeping.arun(self._conninfo, self._thresholds)
        except housekeeping.ThroughPooler as exc:
            self._through_pooler(exc)
            return
        except Exception as exc:
            log.warning(
                "housekeeping could not run (%s: %s); next look in %g s at the earliest",
                type(exc).__name__,
                first_line(exc),
                self._interval,
            )
            return
        level = logging.INFO if report.steps else logging.DEBUG
        log.log(logging.WARNING if report.failed else level, "%s", report.summary())
