from django.db import migrations, models

from pgmb.sql.operations import LockTables, RunMigrationSQL, RunPlpythonSQL


class Migration(migrations.Migration):
    """pgmb 0.2.0, the release's one migration (docs/decisions/0023): what changed since
    0.1.1. ``pgmb/sql/migrations/0003_release_0_2_0.sql`` is written by hand and holds only
    the changes; its ``.down.sql`` puts 0.1.1's objects back. The PL/Python step runs a
    frozen copy of ``pgmb/sql/schema/plpython.sql`` (``make schema``), and migrating back
    runs 0.1.1's copy again. Every step keeps 0.1.1's functions callable with 0.1.1's
    arguments, so its dispatchers go on delivering while this runs (CONTRIBUTING.md)."""

    dependencies = [("pgmb", "0002_release_0_1_1")]

    operations = [
        # First, every table the migration alters (add yours here): the locks are taken
        # together, never one while waiting for another (LockTables, CONTRIBUTING.md).
        LockTables(
            "pgmb_queue",
            # History partitioned by time: both tables are renamed and attached to new ones.
            "pgmb_message",
            "pgmb_attempt",
        ),
        # Pull: history when asked (docs/decisions/0063-pull-queues-without-history.md).
        # With its default a constant, adding the column writes no row, and 0.1.1's
        # statements, which do not name it, keep working.
        migrations.AddField(
            model_name="queue",
            name="keep_history",
            field=models.BooleanField(
                db_default=True,
                default=True,
                help_text=(
                    "Pull queues only. Off: a deleted (acknowledged) message leaves no history "
                    "row, so delivered counts and latency do not count it; archived, retried "
                    "and dead-lettered messages are still recorded."
                ),
            ),
        ),
        RunMigrationSQL("0003_release_0_2_0"),
        RunPlpythonSQL("0003_release_0_2_0_plpython", previous="0002_release_0_1_1_plpython"),
    ]
