"""The one loader of pgmb's SQL files.

Files hold either a whole script (run by a migration with :func:`script`) or named
statements, each introduced by a ``-- name: NAME`` line (read with :func:`query`).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@cache
def script(filename: str) -> str:
    """The whole text of ``pgmb/sql/<filename>``."""
    return resources.files(__package__).joinpath(filename).read_text(encoding="utf-8")


@cache
def _queries(filename: str) -> dict[str, str]:
    text = script(filename)
    marks = list(_NAME.finditer(text))
    return {
        m.group(1): text[m.end() : marks[i + 1].start() if i + 1 < len(marks) else None].strip()
        for i, m in enumerate(marks)
    }


def query(filename: str, name: str) -> str:
    """The statement named ``name`` in ``pgmb/sql/<filename>``."""
    try:
        return _queries(filename)[name]
    except KeyError:
        raise LookupError(f"no query named {name!r} in pgmb/sql/{filename}") from None
