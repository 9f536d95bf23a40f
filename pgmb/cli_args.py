"""Argument types shared by pgmb's management commands (argparse ``type=`` callables).

Each command is a thin argparse wrapper over library functions; what several commands
parse the same way lives here, so that no command imports another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.core.management.base import CommandError
from django.db import connections
from django.utils.connection import ConnectionDoesNotExist

from . import conf

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


def database_alias(given: str | None) -> str:
    """The database a command's ``--database`` names (default ``PGMB['DATABASE']``),
    refused with a clear error when settings.DATABASES has no such alias."""
    alias = given or conf.get().DATABASE
    try:
        connections[alias]
    except ConnectionDoesNotExist:
        raise CommandError(f"--database {alias!r} is not in settings.DATABASES") from None
    return alias
