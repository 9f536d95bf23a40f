"""Argument types shared by pgmb's management commands (argparse ``type=`` callables).

Each command is a thin argparse wrapper over library functions; what several commands
parse the same way lives here, so that no command imports another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

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
