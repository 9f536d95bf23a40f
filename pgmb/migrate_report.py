"""What ``migrate`` says once it has built or upgraded pgmb's schema: the findings of the
database checks, each with the statements a DBA runs. Errors come first (what keeps every
pgmb function from working, such as a schema other roles may create in), then what the
database lacks for the in-database dispatcher and the group roles. The checks ``migrate``
runs before migrating find nothing on a database pgmb is not in yet, so without this a new
database's owner would learn of them only from a later ``manage.py check --database``.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.checks import CheckMessage

from . import conf
from .checks import database_warnings


def report(
    sender: Any,
    *,
    using: str,
    plan: list[tuple[Any, bool]] | None = None,
    verbosity: int = 1,
    stdout: Any = None,
    **kwargs: Any,
) -> None:
    """A post_migrate receiver: print the findings when this run applied pgmb's
    migrations (forwards) to pgmb's database."""
    if verbosity < 1 or using != conf.get().DATABASE:
        return
    if not any(m.app_label == "pgmb" and not backwards for m, backwards in plan or []):
        return
    found = database_warnings(using)
    out = stdout or sys.stdout
    errors = [m for m in found if m.is_serious()]
    warnings = [m for m in found if not m.is_serious()]
    if errors:
        out.write(
            f"pgmb: nothing of pgmb works in database {using!r} until this is fixed "
            f"('manage.py check --database {using}' fails until then):"
        )
        _write(out, errors)
    if warnings:
        out.write(
            f"pgmb: database {using!r} lacks what follows "
            f"('manage.py check --database {using}' says it again):"
        )
        _write(out, warnings)


def _write(out: Any, messages: list[CheckMessage]) -> None:
    for message in messages:
        out.write(f"  {message.id}: {message.msg}")
        if message.hint:
            out.write(f"\tHINT: {message.hint}")
