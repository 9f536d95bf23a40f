from django.db import migrations

from pgmb import indb, sql


def install(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        indb.install_plpython_transport(cursor)
        indb.install_cron_jobs(cursor)


class Migration(migrations.Migration):
    """In-database dispatch: transports, the dispatch procedure, and pg_cron jobs if possible."""

    dependencies = [("pgmb", "0003_delivery_state")]

    operations = [
        migrations.RunSQL(sql.script("dispatch.sql"), sql.script("dispatch.down.sql")),
        migrations.RunPython(install, migrations.RunPython.noop),
    ]
