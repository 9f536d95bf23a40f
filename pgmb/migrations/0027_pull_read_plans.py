from django.db import migrations

from pgmb.sql.operations import RunMigrationSQL


class Migration(migrations.Migration):
    """pgmb.read plans its statement once per session: rows found by primary key whatever
    the estimate, and its generic plan always (plan_cache_mode)."""

    dependencies = [
        ("pgmb", "0026_send_costs"),
    ]

    operations = [
        RunMigrationSQL("0027_pull_read_plans"),
    ]
