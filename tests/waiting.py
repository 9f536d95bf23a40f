"""Waiting for events in tests, not for the clock.

The machines that run the suite are shared and loaded: a test that asserts how long
something took, or sleeps a fixed time for something to happen, fails when the machine is
busy. Tests wait for the event itself instead, with a deadline generous enough to mean
"it hangs", and then assert on what was delivered, stored and returned.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Seconds a test waits for an event before it calls it a hang.
DEADLINE = 60.0


def wait_until(
    predicate: Callable[[], T],
    timeout: float = DEADLINE,
    message: str | Callable[[], str] = "the condition",
    interval: float = 0.02,
) -> T:
    """Call ``predicate`` until it returns something true, and return that.

    Fails the test (AssertionError) after ``timeout`` seconds, naming ``message`` (a
    string, or a function giving one, for a description of the state at that moment).
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            what = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
