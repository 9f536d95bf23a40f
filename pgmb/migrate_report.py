"""What ``migrate`` says once it has built or upgraded pgmb's schema: the findings of the
database checks (what this database lacks for the in-database dispatcher and the group
roles, each with the statements a DBA runs). The checks ``migrate`` runs before migrating
find nothing on a database pgmb is not in yet, so without this a new database's owner
would learn of them only from a later ``manage.py check --database``.
"""

from __future__ import annotations

import sys
from typing import Any

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
    if not found:
        return
    out = stdout or sys.stdout
    out.write(
        f"pgmb: database {using!r} lacks what follows "
        f"('manage.py check --database {using}' says it again):"
    )
    for message in found:
        out.write(f"  {message.id}: {message.msg}")
        if message.hint:
            out.write(f"\tHINT: {message.hint}")
