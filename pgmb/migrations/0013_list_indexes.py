from django.db import migrations, models

from pgmb.sql.operations import RunMigrationSQL


class Migration(migrations.Migration):
    """Indexes of the admin's lists: messages and dead letters newest first, messages by
    routing-key prefix, failed attempts by queue; the claim index of deliveries carries what
    the queue list's figures count.

    The SQL file creates them (``CREATE INDEX IF NOT EXISTS``, so ones built beforehand
    with ``CONCURRENTLY`` are kept); Django only records them in its state.
    """

    dependencies = [
        ("pgmb", "0012_statistics"),
    ]

    operations = [
        RunMigrationSQL("0013_list_indexes"),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="delivery", name="pgmb_delivery_due"),
                migrations.AddIndex(
                    model_name="delivery",
                    index=models.Index(
                        condition=models.Q(("state", "ready")),
                        fields=["queue", "available_at", "id"],
                        include=("attempts", "created_at"),
                        name="pgmb_delivery_due",
                    ),
                ),
                migrations.AddIndex(
                    model_name="attempt",
                    index=models.Index(
                        condition=models.Q(("outcome", "ack"), _negated=True),
                        fields=["queue", "created_at", "status_code"],
                        name="pgmb_attempt_failed",
                    ),
                ),
                migrations.AddIndex(
                    model_name="deadletter",
                    index=models.Index(
                        fields=["created_at", "id"], name="pgmb_dead_letter_created"
                    ),
                ),
                migrations.AddIndex(
                    model_name="message",
                    index=models.Index(fields=["created_at", "id"], name="pgmb_message_created"),
                ),
                migrations.AddIndex(
                    model_name="message",
                    index=models.Index(
                        fields=["routing_key"],
                        name="pgmb_message_routing_key",
                        opclasses=["varchar_pattern_ops"],
                    ),
                ),
            ],
        ),
    ]
