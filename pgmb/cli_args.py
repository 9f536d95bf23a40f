"""Argument types shared by pgmb's management commands (argparse ``type=`` callables).

Each command is a thin argparse wrapper over library functions; what several commands
parse the same way lives here, so that no command imports another.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

from django.core.management.base import CommandError
from django.db import connections
from django.utils.connection import ConnectionDoesNotExist

from . import conf
from .durations import parse_delay

N = TypeVar("N", int, float)


def positive(kind: Callable[[str], N]) -> Callable[[str], N]:
    """An argparse ``type``: a number of ``kind`` (int, float) above 0."""

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(text) from None
        if value <= 0:
            raise ValueError(text)
        return value

    # argparse names the type in its error: "invalid positive int value: '0'".
    parse.__name__ = f"positive {getattr(kind, '__name__', 'number')}"
    return parse


def not_negative(text: str) -> float:
    """An argparse ``type``: a number of seconds, 0 or more."""
    value = float(text)
    if not value >= 0:  # NaN too
        raise ValueError(text)
    return value


not_negative.__name__ = "non-negative number"


def database_alias(given: str | None) -> str:
    """The database a command's ``--database`` names (default ``PGMB['DATABASE']``),
    refused with a clear error when settings.DATABASES has no such alias."""
    alias = given or conf.get().DATABASE
    try:
        connections[alias]
    except ConnectionDoesNotExist:
        raise CommandError(f"--database {alias!r} is not in settings.DATABASES") from None
    return alias


def moment(text: str, now: datetime) -> datetime:
    """A time a command's window names: a duration ago (``2h``, ``1d``, ``90m``, seconds)
    or an ISO-8601 time with a time zone; a clear ValueError otherwise."""
    try:
        parsed = parse_delay(text)
    except ValueError:
        raise ValueError(
            f"invalid time {text!r}: a duration ago (30m, 2h, 1d) or an ISO-8601 time with "
            "a time zone (2026-12-01T10:00:00Z)"
        ) from None
    return parsed if isinstance(parsed, datetime) else now - timedelta(seconds=parsed)
