from django.db import migrations

from pgmb.sql.operations import RunMigrationSQL, RunPlpythonSQL


class Migration(migrations.Migration):
    """The in-database loop posts runs of requests in one PL/Python call
    (pgmb.post_run_via_plpython), whose transport code it shares with
    pgmb.post_via_plpython (pgmb.load_plpython_transport); migrating back restores 0030's
    loop and transport."""

    dependencies = [
        ("pgmb", "0030_keepalive_transport"),
    ]

    operations = [
        RunMigrationSQL("0031_indb_post_runs"),
        RunPlpythonSQL("0031_plpython_runs", restores="0030_keepalive_transport"),
    ]
