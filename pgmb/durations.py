"""Delays written by people: ``30``, ``1.5``, ``500ms``, ``1h30m``, ``2026-12-01T10:00:00Z``.

:func:`parse_delay` turns such a text into what :func:`pgmb.send` takes as ``delay``:
float seconds, or an aware ``datetime``. ``manage.py pgmb_send --delay`` and the ``delay``
of its JSON Lines envelopes both go through it.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta, timezone

from .errors import InvalidDelay

#: Seconds in each duration unit, largest first: the order a duration must be written in.
UNITS: dict[str, float] = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_SECONDS = re.compile(rf"[+-]?{_NUMBER}")
# "ms" before "m" and "s", so that "500ms" is not read as 500 minutes and a stray "s".
_PART = re.compile(rf"({_NUMBER})\s*(ms|d|h|m|s)\s*")
_DURATION = re.compile(rf"-?\s*(?:{_NUMBER}\s*(?:ms|d|h|m|s)\s*)+")
# Only texts that start like a date are tried as ISO-8601, so that a typo such as "10x"
# is reported as a bad delay and not as a bad date.
_ISO_START = re.compile(r"\d{4}-?\d{2}")

_HELP = (
    "use seconds (30, 1.5), a duration (500ms, 45s, 10m, 2h, 1h30m, 1d) "
    "or an ISO-8601 time with a time zone (2026-12-01T10:00:00+00:00)"
)


def check_seconds(seconds: float, text: object = None) -> float:
    """Return ``seconds`` as a float if it is a usable delay, else raise :class:`InvalidDelay`.

    ``text`` is what the user wrote, quoted in the message (defaults to ``seconds``).

    The delay rule, the same as ``pgmb.check_delay()`` in SQL: a delay in seconds must be
    finite, not negative, and end before the year 10000 counted from now (the last moment
    Python's ``datetime`` can hold, far inside what PostgreSQL accepts).
    """
    shown = seconds if text is None else text
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidDelay(f"invalid delay {shown!r}: {_HELP}")
    if not math.isfinite(seconds):
        raise InvalidDelay(f"invalid delay {shown!r}: it must be a finite number of seconds")
    if seconds < 0:
        raise InvalidDelay(f"invalid delay {shown!r}: a delay must not be negative")
    try:
        datetime.now(timezone.utc) + timedelta(seconds=seconds)
    except OverflowError:
        raise InvalidDelay(f"invalid delay {shown!r}: too long (past the year 9999)") from None
    return float(seconds)


def check_time(moment: datetime) -> datetime:
    """Return ``moment`` if it is a time pgmb stores, else raise :class:`InvalidDelay`.

    The time rule, the same as ``pgmb.valid_time()`` in SQL: aware, and from the year 1 to
    before the year 10000 in UTC (what a ``datetime`` holds there; PostgreSQL's infinities and
    years past 9999 are refused in SQL, and no ``datetime`` can carry them).
    """
    if not isinstance(moment, datetime):
        raise InvalidDelay(f"invalid delay {moment!r}: {_HELP}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidDelay(f"delay {moment.isoformat()} must be timezone-aware")
    try:
        moment.astimezone(timezone.utc)
    except OverflowError:
        raise InvalidDelay(
            f"invalid delay {moment.isoformat()}: "
            "a time must be from the year 1 to the year 9999 (UTC)"
        ) from None
    return moment


def _duration(text: str) -> float:
    """Seconds of a ``1h30m``-style duration already matched by ``_DURATION``."""
    negative = text.startswith("-")
    total, previous = 0.0, -1
    order = list(UNITS)
    for match in _PART.finditer(text.lstrip("-").strip()):
        number, unit = match.groups()
        rank = order.index(unit)
        if rank <= previous:
            raise InvalidDelay(
                f"invalid delay {text!r}: write each unit once, largest first (like 1h30m)"
            )
        previous = rank
        total += float(number) * UNITS[unit]
    return -total if negative else total


def _iso(text: str) -> datetime:
    # datetime.fromisoformat() accepts "Z" only from Python 3.11 on.
    iso = text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError as exc:
        # Python's own reason helps when it names a field ("month must be in 1..12").
        reason = "" if str(exc).startswith("Invalid isoformat") else f" ({exc})"
        raise InvalidDelay(
            f"invalid delay {text!r}: not an ISO-8601 time{reason}; {_HELP}"
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidDelay(
            f"invalid delay {text!r}: the time has no time zone; add one, "
            "such as +00:00 or Z, so that it means the same moment everywhere"
        )
    return check_time(moment)


def parse_delay(text: str) -> float | datetime:
    """Parse a delay: float seconds, or the aware ``datetime`` it names.

    Accepted forms:

    * seconds: ``30``, ``1.5``;
    * a duration, units largest first, each at most once: ``500ms``, ``45s``, ``10m``,
      ``2h``, ``1d``, ``1h30m``, ``1.5h``, ``1h 30m``;
    * an ISO-8601 time with a time zone: ``2026-12-01T10:00:00+00:00``,
      ``2026-12-01T10:00:00Z``. A time in the past means "deliver now", as in
      :func:`pgmb.send`.

    Raises :class:`~pgmb.errors.InvalidDelay` (a ``ValueError``) for anything else, for a
    negative delay and for a time without a time zone.
    """
    if not isinstance(text, str):
        raise InvalidDelay(f"invalid delay {text!r}: expected a text, not {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise InvalidDelay(f"invalid delay {text!r}: it is empty; {_HELP}")
    if _SECONDS.fullmatch(stripped):
        return check_seconds(float(stripped), text)
    if _DURATION.fullmatch(stripped):
        return check_seconds(_duration(stripped), text)
    if _ISO_START.match(stripped):
        return _iso(stripped)
    raise InvalidDelay(f"invalid delay {text!r}: {_HELP}")
