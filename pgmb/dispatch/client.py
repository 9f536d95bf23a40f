"""Posting one delivery and classifying what came back."""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import aiohttp

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


#: One ClientTimeout per distinct worker timeout, reused rather than built for every
#: request on the hot path: a worker's timeout rarely changes.
_timeouts: dict[float, aiohttp.ClientTimeout] = {}


def _client_timeout(seconds: float) -> aiohttp.ClientTimeout:
    timeout = _timeouts.get(seconds)
    if timeout is None:
        if len(_timeouts) > 1000:  # timeouts changed often; keep the cache small
            _timeouts.clear()
        timeout = _timeouts[seconds] = aiohttp.ClientTimeout(total=seconds)
    return timeout


#: Every request's User-Agent, on both dispatch paths (the PL/Python transport's too); a
#: message's own User-Agent header does not replace it.
USER_AGENT = "pgmb-dispatcher"


def new_session(concurrency: int) -> aiohttp.ClientSession:
    """One session per dispatcher: pooled keep-alive connections, no cookies.

    No default headers: :func:`post` gives each request all of its own. A session's default
    headers, or its ``skip_auto_headers``, make aiohttp merge header sets at every request,
    ~10 % of the dispatcher's CPU a delivery (docs/benchmarks.md).
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency, limit_per_host=0, ttl_dns_cache=300),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeout: float,
    body_limit: int,
) -> Outcome:
    """POST ``body`` to ``url`` with ``headers`` and pgmb's User-Agent; never raises for
    what the network or the worker does."""
    started = time.perf_counter()
    sent = {**headers, "User-Agent": USER_AGENT}

    def elapsed() -> float:
        return (time.perf_counter() - started) * 1000

    try:
        async with session.post(
            url,
            data=body,
            headers=sent,
            allow_redirects=False,
            timeout=_client_timeout(timeout),
        ) as response:
            status = response.status
            if 200 <= status < 300:
                return Outcome(True, status, elapsed())
            text = (await response.content.read(body_limit)).decode("utf-8", "replace")
            retry_after = (
                parse_retry_after(response.headers.get("Retry-After"))
                if status in RETRY_AFTER_STATUSES
                else None
            )
            reason = f"HTTP {status}"
            if 300 <= status < 400:
                reason += f" redirect to {response.headers.get('Location', '?')} (not followed)"
            return Outcome(False, status, elapsed(), f"{reason}: {text}".strip(), retry_after)
    except asyncio.TimeoutError:
        return Outcome(False, None, elapsed(), f"timeout after {timeout:g}s")
    except aiohttp.ClientConnectorError as exc:
        return Outcome(False, None, elapsed(), f"connection failed: {exc.os_error or exc}")
    except aiohttp.ServerDisconnectedError:
        return Outcome(False, None, elapsed(), "connection closed by the worker without a response")
    except aiohttp.ClientError as exc:
        return Outcome(False, None, elapsed(), f"{type(exc).__name__}: {exc}")
    except OSError as exc:
        return Outcome(False, None, elapsed(), f"network error: {exc}")
