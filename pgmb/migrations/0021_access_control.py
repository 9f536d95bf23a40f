from django.db import migrations

from pgmb.sql.operations import RunMigrationSQL


class Migration(migrations.Migration):
    """Access control: the roles pgmb_producer, pgmb_consumer and pgmb_admin, per-queue
    consume grants, and pgmb.send checking its caller (SECURITY DEFINER)."""

    dependencies = [
        ("pgmb", "0020_indb_commit_batches"),
    ]

    operations = [
        RunMigrationSQL("0021_access_control"),
    ]
