import pgtrigger.compiler
import pgtrigger.migrations
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
            "pgmb_worker",
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
        # A claim's refill of the token bucket runs no worker rules
        # (docs/decisions/0078-a-claim-plans-once-and-pays-no-worker-rules.md): the BEFORE
        # INSERT OR UPDATE trigger becomes one for INSERT and one for an UPDATE OF any
        # column but the bucket's, both running the same rules. After the SQL, so that
        # migrating back drops these triggers before the .down.sql drops the function
        # django-pgtrigger leaves behind.
        pgtrigger.migrations.RemoveTrigger(model_name="worker", name="worker_validate"),
        pgtrigger.migrations.AddTrigger(
            model_name="worker",
            trigger=pgtrigger.compiler.Trigger(
                name="worker_validate",
                sql=pgtrigger.compiler.UpsertTriggerSql(
                    func="RETURN pgmb.prepare_worker(NEW);",
                    hash="52b102380049e28c3efdfde410b408e06da5d4ce",
                    operation="INSERT",
                    pgid="pgtrigger_worker_validate_2c011",
                    table="pgmb_worker",
                    when="BEFORE",
                ),
            ),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name="worker",
            trigger=pgtrigger.compiler.Trigger(
                name="worker_validate_update",
                sql=pgtrigger.compiler.UpsertTriggerSql(
                    func="RETURN pgmb.prepare_worker(NEW);",
                    hash="1c261d3a6d9e64e7afb4bf66837678b8a4d0b267",
                    operation=(
                        'UPDATE OF "id", "name", "endpoint", "rps", "timeout", "burst", '
                        '"secret", "active", "created_at", "breaker_failures", "breaker_rate", '
                        '"breaker_window", "breaker_min_requests", "breaker_cooldown", '
                        '"breaker_cooldown_max", "breaker_state", "breaker_since", '
                        '"breaker_until", "breaker_reason", "breaker_streak", "breaker_trips", '
                        '"breaker_probe", "breaker_window_at", "breaker_requests", '
                        '"breaker_failed", "breaker_prev_requests", "breaker_prev_failed"'
                    ),
                    pgid="pgtrigger_worker_validate_update_3bb89",
                    table="pgmb_worker",
                    when="BEFORE",
                ),
            ),
        ),
    ]
