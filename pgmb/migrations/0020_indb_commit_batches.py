from django.db import migrations

from pgmb.sql.operations import RunMigrationSQL


class Migration(migrations.Migration):
    """The in-database loop commits its outcomes in batches bounded by a count and by
    milliseconds (pgmb.indb_commit_bounds: settings pgmb.indb_commit_every, _ms)."""

    dependencies = [
        ("pgmb", "0019_routing_literals"),
    ]

    operations = [
        RunMigrationSQL("0020_indb_commit_batches"),
    ]
