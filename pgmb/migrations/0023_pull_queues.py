import django.db.models.deletion
from django.db import migrations, models

from pgmb.sql.operations import RunMigrationSQL


class Migration(migrations.Migration):
    """Pull queues: a queue without a worker (pgmb_queue.worker_id nullable) is read by
    clients, PGMQ style (pgmb.read, read_with_poll, pop, set_vt, delete, archive, nack,
    purge); pull consumers register as dispatchers of kind 'consumer' and are woken by
    publishers; the history's 'archived' outcome.

    The SQL file changes the column and the constraint itself (its reverse must delete
    consumer rows before the old constraint comes back), so Django's side is state only.
    """

    dependencies = [
        ("pgmb", "0022_circuit_breaker"),
    ]

    operations = [
        RunMigrationSQL("0023_pull_queues"),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name="dispatcherprocess",
                    name="pgmb_dispatcher_kind",
                ),
                migrations.AlterField(
                    model_name="dispatcherprocess",
                    name="kind",
                    field=models.CharField(
                        choices=[
                            ("external", "external (pgmb_dispatch)"),
                            ("in_database", "in the database (dispatch_loop)"),
                            ("consumer", "pull consumer (pgmb_consume)"),
                        ],
                        max_length=12,
                    ),
                ),
                migrations.AddConstraint(
                    model_name="dispatcherprocess",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            ("kind", "external"),
                            ("kind", "in_database"),
                            ("kind", "consumer"),
                            _connector="OR",
                        ),
                        name="pgmb_dispatcher_kind",
                    ),
                ),
                migrations.AlterField(
                    model_name="queue",
                    name="worker",
                    field=models.ForeignKey(
                        blank=True,
                        help_text=(
                            "Leave empty for a pull queue, read by clients instead of posted "
                            "to a worker."
                        ),
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="queues",
                        to="pgmb.worker",
                    ),
                ),
            ]
        ),
        migrations.AlterField(
            model_name="attempt",
            name="outcome",
            field=models.CharField(
                choices=[
                    ("ack", "acknowledged"),
                    ("retry", "will retry"),
                    ("dead", "dead-lettered"),
                    ("expired", "lease expired"),
                    ("unsent", "lease expired unsent"),
                    ("archived", "archived"),
                ],
                max_length=8,
            ),
        ),
    ]
