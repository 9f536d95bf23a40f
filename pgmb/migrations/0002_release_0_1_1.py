import pgtrigger.compiler
import pgtrigger.migrations
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
        # Publishing: times (0053) checked by admit_message on INSERT and by triggers of their
        # own on UPDATE; message limits on UPDATE too.
        pgtrigger.migrations.RemoveTrigger(
            model_name="message",
            name="admit_message",
        ),
        pgtrigger.migrations.AddTrigger(
            model_name="delivery",
            trigger=pgtrigger.compiler.Trigger(
                name="check_delivery_times",
                sql=pgtrigger.compiler.UpsertTriggerSql(
                    condition="WHEN (NOT (NEW.created_at >= '0001-01-01 00:00:00+00'::timestamptz AND NEW.created_at < '10000-01-01 00:00:00+00'::timestamptz AND NEW.available_at >= '0001-01-01 00:00:00+00'::timestamptz AND NEW.available_at < '10000-01-01 00:00:00+00'::timestamptz))",
                    func="-- Only a row with a time pgmb.valid_time rejects gets here (the trigger's WHEN).\nPERFORM pgmb.refuse_times('pgmb_delivery', NEW.id::text, NEW.created_at, NEW.available_at);\nRETURN NEW;",
                    hash="eb429719d0346cb819c6500aebd6a92726182e09",
                    operation='UPDATE OF "created_at", "available_at"',
                    pgid="pgtrigger_check_delivery_times_a827b",
                    table="pgmb_delivery",
                    when="BEFORE",
                ),
            ),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name="message",
            trigger=pgtrigger.compiler.Trigger(
                name="admit_message",
                sql=pgtrigger.compiler.UpsertTriggerSql(
                    condition="WHEN (NEW.group_key IS NOT NULL OR NEW.depends_on IS NOT NULL OR NEW.dedup_id IS NOT NULL OR NEW.max_retries IS NOT NULL OR NEW.retry_delay IS NOT NULL OR NOT (NEW.created_at >= '0001-01-01 00:00:00+00'::timestamptz AND NEW.created_at < '10000-01-01 00:00:00+00'::timestamptz AND NEW.available_at >= '0001-01-01 00:00:00+00'::timestamptz AND NEW.available_at < '10000-01-01 00:00:00+00'::timestamptz))",
                    func="-- Only messages with an option other than priority, or with a time pgmb.valid_time\n-- rejects, get here (the trigger's WHEN).\nRETURN pgmb.admit_message(NEW);",
                    hash="0f7c6c5d3e302e3fa5a9a6382f2e1a876f5a9f9b",
                    operation="INSERT",
                    pgid="pgtrigger_admit_message_8d54e",
                    table="pgmb_message",
                    when="BEFORE",
                ),
            ),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name="message",
            trigger=pgtrigger.compiler.Trigger(
                name="check_message_update",
                sql=pgtrigger.compiler.UpsertTriggerSql(
                    condition="WHEN (NOT pgmb.acceptable_message(NEW.body, NEW.headers))",
                    func="-- Only an UPDATE that gives a message a body or headers the limits reject gets here (the\n-- trigger's WHEN): the rule route_messages holds for inserts, for every writer.\nPERFORM pgmb.refuse_message(NEW.id, NEW.routing_key, NEW.body, NEW.headers);\nRETURN NEW;",
                    hash="4e0cd322325deff498e6e2b9fd05d14e086fe867",
                    operation='UPDATE OF "body", "headers"',
                    pgid="pgtrigger_check_message_update_d3f59",
                    table="pgmb_message",
                    when="BEFORE",
                ),
            ),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name="message",
            trigger=pgtrigger.compiler.Trigger(
                name="check_message_times",
                sql=pgtrigger.compiler.UpsertTriggerSql(
                    condition="WHEN (NOT (NEW.created_at >= '0001-01-01 00:00:00+00'::timestamptz AND NEW.created_at < '10000-01-01 00:00:00+00'::timestamptz AND NEW.available_at >= '0001-01-01 00:00:00+00'::timestamptz AND NEW.available_at < '10000-01-01 00:00:00+00'::timestamptz))",
                    func="-- Only a row with a time pgmb.valid_time rejects gets here (the trigger's WHEN).\nPERFORM pgmb.refuse_times('pgmb_message', NEW.id::text, NEW.created_at, NEW.available_at);\nRETURN NEW;",
                    hash="723cc8c4a1ac9f98bca002e07e2224d0720ab1e0",
                    operation='UPDATE OF "created_at", "available_at"',
                    pgid="pgtrigger_check_message_times_9f153",
                    table="pgmb_message",
                    when="BEFORE",
                ),
            ),
        ),
    ]
