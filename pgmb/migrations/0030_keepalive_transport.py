from django.db import migrations

from pgmb.sql.operations import RunMigrationSQL, RunPlpythonSQL


class Migration(migrations.Migration):
    """pgmb.post_via_plpython keeps its connections alive (one per scheme, host and port in
    each backend) instead of opening one per request, and the in-database loop looks its
    transport up once per claim instead of once per request; migrating back restores both."""

    dependencies = [
        ("pgmb", "0029_publish_costs"),
    ]

    operations = [
        RunMigrationSQL("0030_loop_transport"),
        RunPlpythonSQL("0030_keepalive_transport"),
    ]
