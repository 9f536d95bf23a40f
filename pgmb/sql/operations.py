"""The migration operations that run pgmb's versioned SQL files.

Each release has one migration (docs/decisions/0023-one-migration-per-release.md), and its
``pgmb/sql/migrations/NNNN_*.sql`` files are run by that migration alone, through these
operations; once the release is cut they are never edited: upgrading a database runs the
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

    def __init__(self, name: str, previous: str | None = None) -> None:
        self.sql_name = name
        self.previous = previous
        super().__init__(self._forward, self._backward)

    def _forward(self, apps: Any, schema_editor: Any) -> None:
        from .. import indb

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
