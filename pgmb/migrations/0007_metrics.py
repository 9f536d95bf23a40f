from django.db import migrations, models

from pgmb.sql.operations import RunMigrationSQL


class Migration(migrations.Migration):
    """Metrics: pgmb.metrics(), pgmb.metrics_all(), pgmb.worker_metrics(), an index of acks.

    The index is created by the SQL file (``CREATE INDEX IF NOT EXISTS``, so one built
    beforehand with ``CONCURRENTLY`` is kept); Django only records it in its state.
    """

    dependencies = [
        ("pgmb", "0006_pause_permissions"),
    ]

    operations = [
        RunMigrationSQL("0007_metrics"),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="attempt",
                    index=models.Index(
                        condition=models.Q(("outcome", "ack")),
                        fields=["queue", "created_at"],
                        name="pgmb_attempt_acked",
                    ),
                ),
            ],
        ),
    ]
