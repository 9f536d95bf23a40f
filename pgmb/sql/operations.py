"""The migration operations that run pgmb's versioned SQL files.

Each release has one migration (docs/decisions/0023-one-migration-per-release.md), and its
``pgmb/sql/migrations/NNNN_*.sql`` files are run by that migration alone, through these
operations; once the release is cut they are never edited: upgrading a database runs the
very files it missed, in order (``tests/migrations`` checks both rules).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

from django.db import OperationalError, migrations, transaction

from . import has_down_script, migration_script


class RunMigrationSQL(migrations.RunSQL):
    """Run ``migrations/<name>.sql``; migrating back runs ``<name>.down.sql``."""

    def __init__(self, name: str) -> None:
        self.sql_name = name
        super().__init__(migration_script(name), migration_script(name, down=True))

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return f"{__name__}.{type(self).__qualname__}", [self.sql_name], {}

    def describe(self) -> str:
        return f"Run pgmb/sql/migrations/{self.sql_name}.sql"


class RunPlpythonSQL(migrations.RunPython):
    """Run ``migrations/<name>.sql`` if PL/Python can be had in this database and the role
    migrating may create functions in it (a superuser: plpython3u is untrusted).

    The file defines functions in ``LANGUAGE plpython3u``: without the language, or as an
    owner role that is not a superuser (a managed service's), migrating still succeeds, and
    ``migrate``'s report and the system checks say what the in-database path lacks and what
    a superuser runs (``manage.py pgmb_cron install``) to load it. Migrating back runs,
    where the language is installed and the role may, ``<name>.down.sql`` if there is one,
    or else ``previous``, the previous release's copy of the transport, which replaces the
    functions this one made; with neither, the reverse of the migration that created
    schema ``pgmb`` drops the functions with the schema.
    """

    #: Written as SQL for the extension's scripts (pgmb/extension.py) and sqlmigrate.
    reduces_to_sql = True

    def __init__(self, name: str, previous: str | None = None) -> None:
        self.sql_name = name
        self.previous = previous
        super().__init__(self._forward, self._backward)

    def _forward(self, apps: Any, schema_editor: Any) -> None:
        from .. import indb

        if schema_editor.collect_sql:
            # As SQL: the transport where plpython3u is installed already (an extension's
            # script may not create another extension).
            script = migration_script(self.sql_name)
            schema_editor.collected_sql.append(
                "DO $pgmb_plpython$\nBEGIN\n"
                "    IF EXISTS (SELECT FROM pg_catalog.pg_language\n"
                "               WHERE lanname = 'plpython3u') THEN\n"
                f"        EXECUTE $pgmb_transport${script}$pgmb_transport$;\n"
                "    END IF;\nEND $pgmb_plpython$;"
            )
            return
        with schema_editor.connection.cursor() as cursor:
            indb.install_plpython_transport(cursor, migration_script(self.sql_name))

    def _backward(self, apps: Any, schema_editor: Any) -> None:
        from .. import indb

        if has_down_script(self.sql_name):
            script = migration_script(self.sql_name, down=True)
        elif self.previous is not None:
            script = migration_script(self.previous)
        else:
            return
        with schema_editor.connection.cursor() as cursor:
            caps = indb.capabilities(cursor)
            if caps.plpython_installed and caps.plpython_loadable:
                cursor.execute(script)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs = {} if self.previous is None else {"previous": self.previous}
        return f"{__name__}.{type(self).__qualname__}", [self.sql_name], kwargs

    def describe(self) -> str:
        return f"Run pgmb/sql/migrations/{self.sql_name}.sql where PL/Python is available"


#: SQLSTATE of a lock not had within lock_timeout (lock_not_available).
_LOCK_NOT_AVAILABLE = "55P03"


def lock_statement(connection: Any, tables: Sequence[str]) -> str:
    """LOCK TABLE of ``tables`` (schema-qualified where not in the search path)."""
    names = ", ".join(
        ".".join(connection.ops.quote_name(part) for part in name.split(".")) for name in tables
    )
    return f"LOCK TABLE {names} IN ACCESS EXCLUSIVE MODE"


def lock_tables(
    connection: Any, tables: Sequence[str], wait_ms: int = 50, give_up_after: float = 120.0
) -> None:
    """Take ACCESS EXCLUSIVE locks on ``tables`` (schema-qualified where not in the search
    path) in the transaction of ``connection`` (a Django connection), all in one statement,
    waiting ``wait_ms`` at most for each lock; if one cannot be had, let go of those taken
    (a savepoint rolls back) and try again after a short random pause, for
    ``give_up_after`` seconds (then raise OperationalError)."""
    statement = lock_statement(connection, tables)
    deadline = time.monotonic() + give_up_after
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        [(previous,)] = cursor.fetchall()
        while True:
            try:
                with transaction.atomic(using=connection.alias):
                    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{wait_ms}ms"])
                    cursor.execute(statement)
                break
            except OperationalError as exc:
                if getattr(exc.__cause__, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
                    raise
                if time.monotonic() > deadline:
                    raise OperationalError(
                        f"could not lock {', '.join(tables)} within {give_up_after:g} s: "
                        "other sessions kept holding them (see pg_locks and "
                        "pg_stat_activity); the migration changed nothing, run it again"
                    ) from exc
            time.sleep(random.uniform(0.02, 0.2))  # noqa: S311 (a pause, not a secret)
        # The savepoint kept the short timeout: the rest of the migration waits as usual.
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])


class LockTables(migrations.RunPython):
    """Take ACCESS EXCLUSIVE locks on ``tables`` first, all together (:func:`lock_tables`),
    for the rest of the migration's transaction, so that no later statement of it waits on
    a lock while holding one (docs/decisions/0062-upgrades-under-running-dispatchers.md).

    Dispatchers and publishers keep running while a release migrates: a migration that
    holds one table and waits for another deadlocks with a ``pgmb.send`` or ``pgmb.claim``
    that holds the second and waits for the first, and PostgreSQL aborts one of them (the
    producer's send, or the migration). Here each lock is waited for ``wait_ms`` at most,
    all of them together well under ``deadlock_timeout`` (1 s by default), so that no
    client waits on the migration long enough to look for a deadlock: if one cannot be
    had, the locks taken so far are let go, the clients queued behind them go on, and the
    statement is tried again. Migrating back takes no locks (this operation's reverse runs
    after the reverse of the others).
    """

    def __init__(self, *tables: str, wait_ms: int = 50, give_up_after: float = 120.0) -> None:
        self.tables = tables
        self.wait_ms = wait_ms
        self.give_up_after = give_up_after
        super().__init__(self._forward, migrations.RunPython.noop)

    #: Written as one LOCK TABLE for the extension's scripts (pgmb/extension.py), which
    #: cannot try again: ALTER EXTENSION pgmb UPDATE waits for the locks.
    reduces_to_sql = True

    def _forward(self, apps: Any, schema_editor: Any) -> None:
        if schema_editor.collect_sql:
            schema_editor.collected_sql.append(
                lock_statement(schema_editor.connection, self.tables) + ";"
            )
            return
        lock_tables(schema_editor.connection, self.tables, self.wait_ms, self.give_up_after)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs = {"wait_ms": self.wait_ms, "give_up_after": self.give_up_after}
        return f"{__name__}.{type(self).__qualname__}", list(self.tables), kwargs

    def describe(self) -> str:
        return f"Lock {', '.join(self.tables)} (waiting {self.wait_ms} ms a try)"
