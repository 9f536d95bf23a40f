"""Build pgmb's schema the way the source describes it: the Django models' tables, then
``pgmb/sql/schema/`` in its load order (and the PL/Python file where the language can be
had), then django-pgtrigger's triggers. Run as ``python -m tests.migrations.from_source``
with ``PGMB_DB_NAME`` naming an empty database; the migrations must build the same catalog.
"""

from __future__ import annotations

import os


def build() -> None:
    import pgtrigger
    from django.apps import apps
    from django.db import connection, transaction
    from django.db.backends.postgresql.schema import DatabaseSchemaEditor

    from pgmb import indb, sql

    models = [m for m in apps.get_app_config("pgmb").get_models() if m._meta.managed]
    # Django's own editor: django-pgtrigger's would create the triggers with the tables,
    # before the functions their conditions call.
    with DatabaseSchemaEditor(connection) as editor:
        for model in models:
            editor.create_model(model)
    with connection.cursor() as cursor:
        cursor.execute(sql.schema_source())
    pgtrigger.install()
    with transaction.atomic(), connection.cursor() as cursor:
        indb.install_plpython_transport(cursor)


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    build()
