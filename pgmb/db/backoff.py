"""Waits between attempts to reach the database again: short, capped low, jittered.

The cap is what bounds the time from "the server accepts connections again" to "the
dispatcher is delivering": at most one wait, so half a second. An attempt against a
server that is down costs a refused TCP connection, so trying twice a second is cheap.
The jitter ("decorrelated jitter": each wait drawn between the first wait and three times
the last one) spreads the reconnections of many dispatchers after a restart, so they do
not all arrive in the same instant.
"""

from __future__ import annotations

import random

#: The first wait and the longest one, in seconds.
FIRST = 0.05
CAP = 0.5


class Backoff:
    """The waits of one outage; :meth:`reset` once connected again."""

    def __init__(self, first: float = FIRST, cap: float = CAP) -> None:
        self.first = first
        self.cap = cap
        self._last = 0.0

    def next(self) -> float:
        """Seconds to wait before the next attempt."""
        upper = min(self.cap, max(self.first, self._last * 3))
        self._last = random.uniform(self.first, upper)  # noqa: S311 (jitter, not a secret)
        return self._last

    def reset(self) -> None:
        self._last = 0.0
