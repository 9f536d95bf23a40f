"""Spacing requests to one worker inside a process.

The token bucket in Postgres caps the rate across processes; pacing spreads what one
claim took over time, so a second's budget is not fired in one burst.
"""

from __future__ import annotations

import asyncio
import time


class Pacer:
    """Hands out send times at least ``1 / rps`` apart."""

    def __init__(self) -> None:
        self._next = 0.0

    async def wait(self, rps: int) -> None:
        if rps >= 1000:
            return  # sub-millisecond spacing: the event loop could not keep it anyway
        now = time.monotonic()
        start = max(now, self._next)
        self._next = start + 1.0 / rps
        if start > now:
            await asyncio.sleep(start - now)
