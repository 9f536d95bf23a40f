from django.db import migrations

from pgmb.sql.operations import LockTables, RunMigrationSQL, RunPlpythonSQL


class Migration(migrations.Migration):
    """pgmb 0.1.1, the release's one migration (docs/decisions/0023): what changed since
    0.1.0. ``pgmb/sql/migrations/0002_release_0_1_1.sql`` is written by hand and holds only
    the changes; its ``.down.sql`` puts 0.1.0's objects back. The PL/Python step runs a
    frozen copy of ``pgmb/sql/schema/plpython.sql`` (``make schema``), and migrating back
    runs 0.1.0's copy again. Every step keeps 0.1.0's functions callable with 0.1.0's
    arguments, so its dispatchers go on delivering while this runs (CONTRIBUTING.md)."""

    dependencies = [("pgmb", "0001_initial")]

    operations = [
        # First, every table the migration alters (add yours here): the locks are taken
        # together, never one while waiting for another (LockTables, CONTRIBUTING.md).
        LockTables(
            "pgmb_worker",
            "pgmb_worker_secret",
            "pgmb_queue",
            "pgmb_message",
            "pgmb_delivery",
            "pgmb_dead_letter",
            "pgmb_attempt",
            "pgmb_dispatcher",
            "pgmb.endpoint_policy",
            "pgmb.queue_grant",
        ),
        RunMigrationSQL("0002_release_0_1_1"),
        RunPlpythonSQL("0002_release_0_1_1_plpython", previous="0001_initial_plpython"),
    ]
