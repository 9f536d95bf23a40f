"""Spacing requests to one worker inside a process.

The token bucket in Postgres caps the rate across processes; pacing spreads what one
claim took over time, so a second's budget is not fired in one burst.
"""

from __future__ import annotations

import asyncio
import time

#: Workers allowed this many requests a second or more are not paced: sub-millisecond
#: spacing is finer than the event loop could keep anyway.
UNPACED_RPS = 1000


class Pacer:
    """Hands out send times at least ``1 / rps`` apart."""

    def __init__(self) -> None:
        self._next = 0.0

    async def wait(self, rps: int) -> None:
        if rps >= UNPACED_RPS:
            return
        now = time.monotonic()
        start = max(now, self._next)
        self._next = start + 1.0 / rps
        if start > now:
            await asyncio.sleep(start - now)
