"""Posting one delivery and classifying what came back."""

from __future__ import annotations

import asyncio
import email.utils
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


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
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


def new_session(concurrency: int) -> aiohttp.ClientSession:
    """One session per dispatcher: pooled keep-alive connections, no cookies."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency, limit_per_host=0, ttl_dns_cache=300),
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent",),
        headers={"User-Agent": "pgmb-dispatcher"},
    )


async def post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeout: float,
    body_limit: int,
) -> Outcome:
    """POST ``body`` to ``url``; never raises for what the network or the worker does."""
    started = time.perf_counter()

    def elapsed() -> float:
        return (time.perf_counter() - started) * 1000

    try:
        async with session.post(
            url,
            data=body,
            headers=headers,
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
