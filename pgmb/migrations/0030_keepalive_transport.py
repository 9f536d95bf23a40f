from django.db import migrations

from pgmb.sql.operations import RunPlpythonSQL


class Migration(migrations.Migration):
    """pgmb.post_via_plpython keeps its connections alive (one per scheme, host and port in
    each backend) instead of opening one per request; migrating back restores 0001's."""

    dependencies = [
        ("pgmb", "0029_publish_costs"),
    ]

    operations = [
        RunPlpythonSQL("0030_keepalive_transport"),
    ]
