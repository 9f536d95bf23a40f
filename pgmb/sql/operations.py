"""The migration operations that run pgmb's versioned SQL files.

Each ``pgmb/sql/migrations/NNNN_*.sql`` file is run by exactly one Django migration, through
one of these operations, and is never edited once released: upgrading a database runs the
very files it missed, in order (``tests/migrations`` checks both rules).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

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
    """Run ``migrations/<name>.sql`` if PL/Python can be had in this database.

    The file defines functions in ``LANGUAGE plpython3u``: without the language, migrating
    still succeeds and the system checks say what the in-database path lacks. Migrating
    back runs ``<name>.down.sql`` where the language is installed, if there is one (it puts
    back the functions' earlier versions), then, with ``restores``, that earlier migration's
    file again (a released file puts its own functions back, no copy of them needed); without
    either, the reverse of the migration that created schema ``pgmb`` drops the functions.
    """

    def __init__(self, name: str, restores: str | None = None) -> None:
        self.sql_name = name
        self.restores = restores
        super().__init__(self._forward, self._backward)

    def _forward(self, apps: Any, schema_editor: Any) -> None:
        from .. import indb

        with schema_editor.connection.cursor() as cursor:
            indb.install_plpython_transport(cursor, migration_script(self.sql_name))

    def _backward(self, apps: Any, schema_editor: Any) -> None:
        from .. import indb

        if not has_down_script(self.sql_name) and self.restores is None:
            return
        with schema_editor.connection.cursor() as cursor:
            if indb.capabilities(cursor).plpython_installed:
                if has_down_script(self.sql_name):
                    cursor.execute(migration_script(self.sql_name, down=True))
                if self.restores is not None:
                    cursor.execute(migration_script(self.restores))

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs = {} if self.restores is None else {"restores": self.restores}
        return f"{__name__}.{type(self).__qualname__}", [self.sql_name], kwargs

    def describe(self) -> str:
        return f"Run pgmb/sql/migrations/{self.sql_name}.sql where PL/Python is available"
