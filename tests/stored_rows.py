"""Rows as a database from before a rule could hold them: written with pgmb's triggers off
(``session_replication_role = replica``), so tests can show that what was stored before a
rule was added is still read, shown and delivered safely."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection


@contextmanager
def triggers_off() -> Iterator[None]:
    """Writes through Django's connection inside the block fire no trigger."""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET session_replication_role = DEFAULT")


def store_with_triggers_off(statement: str, params: tuple) -> None:
    """Run one write that validation refuses today, as an older database could hold it."""
    with triggers_off(), connection.cursor() as cursor:
        cursor.execute(statement, params)
