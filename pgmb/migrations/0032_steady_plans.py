from django.db import migrations

from pgmb.sql.operations import RunMigrationSQL


class Migration(migrations.Migration):
    """pgmb.claim, pgmb.ack, pgmb.start and pgmb.settle_failures plan at every call, never
    scan pgmb_delivery whole and find their rows by primary key, so that their plans hold as
    the table empties and fills; migrating back restores their earlier versions."""

    dependencies = [
        ("pgmb", "0031_indb_post_runs"),
    ]

    operations = [
        RunMigrationSQL("0032_steady_plans"),
    ]
