"""PGMQ, the rival the SQL benchmarks are held against, loaded from a file the user names.

pgmb does not ship PGMQ. Name PGMQ's SQL-only install script (``pgmq-extension/sql/pgmq.sql``
of a PGMQ release, e.g. tag ``v1.5.1`` of https://github.com/pgmq/pgmq) with
``--pgmq-sql FILE`` or the environment variable ``PGMQ_SQL``. Without one, the benchmarks
hold pgmb against the plain-table baseline alone and say so in their output.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import psycopg

from bench import harness

ENV = "PGMQ_SQL"
QUEUE = "q"  # the name bench/pgbench/pgmq_*.sql use
NOT_GIVEN = f"no PGMQ given (--pgmq-sql FILE or {ENV}=FILE)"


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pgmq-sql",
        type=Path,
        metavar="FILE",
        default=Path(os.environ[ENV]) if os.environ.get(ENV) else None,
        help=f"PGMQ's pgmq.sql to compare with (default: ${ENV}; none: the plain table only)",
    )


def _without_extension_only(script: str) -> str:
    """PGMQ's SQL minus what works only inside CREATE EXTENSION.

    Extension scripts may open with a psql ``\\echo ... \\quit`` guard and register tables
    with ``pg_extension_config_dump``; PGMQ 1.5.1's file has neither (it tests for the
    extension itself), another release may.
    """
    return "".join(
        line
        for line in script.splitlines(keepends=True)
        if not line.startswith("\\") and "pg_extension_config_dump(" not in line
    )


def load(path: Path) -> str | None:
    """PGMQ's SQL-only install and its queue, all or nothing: None, or why it failed."""
    try:
        script = _without_extension_only(path.read_text())
        with harness.connect() as conn, conn.transaction():
            conn.execute("CREATE SCHEMA pgmq")
            conn.execute(script)
            conn.execute("SELECT pgmq.create(%s)", (QUEUE,))
    except (OSError, psycopg.Error) as error:
        return f"{type(error).__name__}: {error}".strip()
    return None


def describe(path: Path | None) -> str:
    """The ``pgmq`` line of the machine's description."""
    if path is None:
        return f"{NOT_GIVEN}: compared with the plain-table baseline only"
    return f"loaded from {path}"
