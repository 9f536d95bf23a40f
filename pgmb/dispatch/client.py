"""Posting one delivery and classifying what came back."""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from .. import endpoint_policy, final_answers
from . import http1

#: Statuses whose Retry-After is honoured.
RETRY_AFTER_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class Outcome:
    """What one attempt produced; ``ok`` means the worker answered 2xx."""

    ok: bool
    status: int | None
    duration_ms: float
    error: str = ""
    retry_after: float | None = None


#: How the error of a failure of pgmb's own begins: the request could not be built or encoded,
#: or the endpoint policy refused its address, so the endpoint was asked nothing. Such a
#: failure is the delivery's attempt (retried, then dead-lettered, with this reason) but never
#: the endpoint's: ``pgmb.own_failure()`` in SQL, which the circuit breaker asks, knows it by
#: this very text and a missing status (docs/delivery.md, Failures of pgmb's own).
OWN_FAILURE = "pgmb's own failure: "


def own_failure(duration_ms: float, reason: str) -> Outcome:
    """The outcome of a failure of pgmb's own (see :data:`OWN_FAILURE`)."""
    return Outcome(False, None, duration_ms, OWN_FAILURE + reason)


#: The Retry-After rule, the very regex text of ``pgmb.retry_after_seconds()`` in SQL: blanks
#: (space, tab) around either delta-seconds (ASCII digits only) or an HTTP-date in
#: IMF-fixdate form (``Sun, 06 Nov 1994 08:49:37 GMT``; hours 00-23, minutes and seconds
#: 00-59, the weekday not checked against the date). The obsolete RFC 850 and asctime
#: forms are not accepted.
RETRY_AFTER_PATTERN = (
    r"^[ \t]*(?:([0-9]+)|(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), ([0-9]{2}) "
    r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) ([0-9]{4}) "
    r"([01][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9]) GMT)[ \t]*$"
)
_RETRY_AFTER = re.compile(RETRY_AFTER_PATTERN)
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header, never negative (a past date gives 0).

    None for anything the rule above does not accept, for a date that does not exist
    (31 Feb, year 0) and for delta-seconds too large for a float; never an exception.
    """
    match = _RETRY_AFTER.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return None
    delta, day, month, year, hour, minute, second = match.groups()
    if delta is not None:
        seconds = float(delta)
        return seconds if math.isfinite(seconds) else None
    try:
        when = datetime(
            int(year),
            _MONTHS.index(month) + 1,
            int(day),
            int(hour),
            int(minute),
            int(second),
            tzinfo=timezone.utc,
        )
    except ValueError:
        return None
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


#: Every request's User-Agent, on both dispatch paths (the PL/Python transport's too); a
#: message's own User-Agent header does not replace it.
USER_AGENT = "pgmb-dispatcher"


def new_session(concurrency: int) -> http1.Client:
    """One client per dispatcher: pooled keep-alive connections, as many kept idle as
    requests may be in flight."""
    return http1.Client(kept=concurrency, policy=endpoint_policy.current())


async def post(
    session: http1.Client,
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeout: float,
    body_limit: int,
) -> Outcome:
    """POST ``body`` to ``url`` with ``headers`` and pgmb's User-Agent; never raises for
    what the network, the worker or the URL does."""
    started = time.perf_counter()

    def elapsed() -> float:
        return (time.perf_counter() - started) * 1000

    try:
        response = await session.post(
            url, body, {**headers, "User-Agent": USER_AGENT}, timeout, body_limit
        )
    except ValueError as exc:  # a URL or a header that cannot be sent: nothing was sent
        return own_failure(elapsed(), f"could not send the request: {exc}")
    except asyncio.TimeoutError:
        return Outcome(False, None, elapsed(), f"timeout after {timeout:g}s")
    except http1.Refused as exc:  # the endpoint policy: the endpoint was not asked
        return own_failure(elapsed(), f"connection failed: {exc}")
    except http1.ConnectError as exc:
        return Outcome(False, None, elapsed(), f"connection failed: {exc}")
    except http1.NoResponse:
        return Outcome(False, None, elapsed(), "connection closed by the worker without a response")
    except http1.BadResponse as exc:
        return Outcome(False, None, elapsed(), f"invalid response from the worker: {exc}")
    except OSError as exc:
        return Outcome(False, None, elapsed(), f"network error: {exc}")
    status = response.status
    if 200 <= status < 300:
        return Outcome(True, status, elapsed())
    text = response.body.decode("utf-8", "replace")
    retry_after = (
        parse_retry_after(response.headers.get("retry-after"))
        if status in RETRY_AFTER_STATUSES
        else None
    )
    reason = f"HTTP {status}"
    if 300 <= status < 400:
        reason += f" redirect to {response.headers.get('location', '?')} (not followed)"
    if final_answers.aborts(response.headers):  # pgmb.settle_failures knows it by this text
        reason = final_answers.ABORTED + reason
    return Outcome(False, status, elapsed(), f"{reason}: {text}".strip(), retry_after)
