import django.contrib.postgres.fields
import django.core.validators
import django.db.models.deletion
import django.db.models.functions.datetime
import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations, models

import pgmb.models
import pgmb.trigger_guard
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
            # Publishing: the routing trigger, reinstalled (fair shares per key: it copies
            # the fairness header). History partitioned by time:
            # both history tables are renamed and attached to new ones.
            "pgmb_message",
            "pgmb_attempt",
            # Archive by day: pgmb_archive_day's foreign key to it.
            "pgmb_archive_run",
            # Fair shares per key: the key column, its indexes and trigger. Expiry: a
            # column of deliveries (queues and messages are above). Cancel and run now: the
            # column that marks a delivery cancelled in flight. Unique while live: its key
            # column, unique index and trigger.
            "pgmb_delivery",
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
        # Answers that stop retries (docs/decisions/0080-answers-that-stop-retries.md): each
        # column's default a constant (no row written), which 0.1.1's INSERTs of workers get.
        migrations.AddField(
            model_name="worker",
            name="dead_statuses",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.TextField(),
                blank=True,
                db_default=[],
                default=list,
                help_text=(
                    "Statuses (410) or classes (4xx), separated by commas, whose answer "
                    "dead-letters a delivery at once instead of retrying it. Empty: every "
                    "failure is retried."
                ),
                size=None,
                validators=[pgmb.models.validate_dead_statuses],
                verbose_name="dead-letter at once on",
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="retried_statuses",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.TextField(),
                blank=True,
                db_default=[],
                default=list,
                help_text=(
                    "Statuses retried as usual although a class above names them, such as 408, 429."
                ),
                size=None,
                validators=[pgmb.models.validate_retried_statuses],
                verbose_name="retried all the same",
            ),
        ),
        # A cap on requests in flight (docs/decisions/0081-a-cap-on-requests-in-flight.md):
        # NULL, no cap, by default (no row written); 0.1.1's INSERTs of workers leave it so.
        migrations.AddField(
            model_name="worker",
            name="max_in_flight",
            field=models.IntegerField(
                blank=True,
                help_text=(
                    "How many requests this worker may have in flight at once, across every "
                    "dispatcher. Empty: no cap."
                ),
                null=True,
                validators=[django.core.validators.MinValueValidator(1)],
                verbose_name="requests in flight at most",
            ),
        ),
        # Expiry (docs/decisions/0083-expiry.md): nullable columns without a default and one
        # with a constant default, so no row is written, and 0.1.1's statements, which do
        # not name them, keep working (their messages and queues expire never). Before the
        # routing trigger below, which reads them.
        migrations.AddField(
            model_name="delivery",
            name="expires_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="message",
            name="expires_at",
            field=models.DateTimeField(blank=True, null=True, verbose_name="expires"),
        ),
        migrations.AddField(
            model_name="queue",
            name="message_ttl",
            field=models.FloatField(
                blank=True,
                help_text="Messages not delivered this many seconds after publication expire.",
                null=True,
                validators=[
                    django.core.validators.MinValueValidator(0.001),
                    pgmb.models.validate_finite,
                    django.core.validators.MaxValueValidator(2592000),
                ],
                verbose_name="message TTL (s)",
            ),
        ),
        migrations.AddField(
            model_name="queue",
            name="on_expiry",
            field=models.CharField(
                choices=[("dead_letter", "dead-letter"), ("drop", "drop")],
                db_default="dead_letter",
                default="dead_letter",
                max_length=16,
                verbose_name="on expiry",
            ),
        ),
        # Unique while live (docs/decisions/0090-unique-while-live.md): nullable columns
        # without a default (no row written; 0.1.1's statements, which do not name them, keep
        # working and make deliveries without a key). Before the routing trigger below,
        # which copies the message's key to its deliveries.
        migrations.AddField(
            model_name="delivery",
            name="unique_key",
            field=models.CharField(
                blank=True, editable=False, max_length=128, null=True, verbose_name="unique key"
            ),
        ),
        migrations.AddField(
            model_name="message",
            name="on_duplicate",
            field=models.CharField(
                blank=True,
                choices=[("skip", "skip"), ("replace", "replace")],
                max_length=7,
                null=True,
                verbose_name="on duplicate",
            ),
        ),
        migrations.AddField(
            model_name="message",
            name="unique_key",
            field=models.CharField(
                blank=True, max_length=128, null=True, verbose_name="unique key"
            ),
        ),
        # Partial: no entry (and no probe at insert) for a delivery without a key. The table
        # holds only live deliveries, so the build under the lock is short.
        migrations.AddConstraint(
            model_name="delivery",
            constraint=models.UniqueConstraint(
                condition=models.Q(("unique_key__isnull", False)),
                fields=("queue", "unique_key"),
                name="pgmb_delivery_unique_key",
            ),
        ),
        # Publishing: the routing trigger checks pgtrigger.ignore() without a subtransaction
        # (pgmb/trigger_guard.py, docs/decisions/0073-publishing-write-path.md). Dropped and
        # created again in this transaction, pgmb_message locked first: no publish runs
        # between the two, and 0.1.1's publishers find the same trigger doing the same.
        # Expiry: it copies the message's or the queue's expiry to each delivery. Unique
        # while live: and the message's unique key.
        pgtrigger.migrations.RemoveTrigger(
            model_name="message",
            name="route_messages",
        ),
        pgtrigger.migrations.AddTrigger(
            model_name="message",
            trigger=pgtrigger.compiler.Trigger(
                name="route_messages",
                sql=pgmb.trigger_guard.GuardedUpsertTriggerSql(
                    func="-- The statement's routing keys, bodies and headers pass their rules first (routing.sql,\n-- pgmb.message_problem): here, not as a CHECK, whose\n-- expression PostgreSQL would prepare again for every INSERT; this statement is planned once\n-- per session.\nPERFORM pgmb.refuse_message(m.id, m.routing_key, m.body, m.headers) FROM new_messages AS m\nWHERE NOT (pgmb.valid_routing_key(m.routing_key) AND pgmb.acceptable_message(m.body, m.headers)) LIMIT 1;\n-- One INSERT routes the whole statement's messages; a NOTIFY, if some dispatcher waits for\n-- one (pgmb.wake_dispatchers), wakes dispatchers once at commit (identical notifications\n-- in a transaction are merged).\n-- A delivery with a group or dependencies may be made 'waiting' by pgmb.hold_delivery.\n-- A queue with a fairness header gets the header's value as the key (fairness.sql). Its\n-- expiry is the earlier of its message's and its queue's message_ttl after publication\n-- (least() skips NULLs: neither set, none). A delivery with a unique key is left out where\n-- one with its key is live (pgmb.admit_unique_delivery).\nINSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at, created_at,\n                           priority, group_key, depends_on, fair_key, expires_at, unique_key)\nSELECT m.id, r.queue_id, 'ready', 0, m.available_at, m.created_at, m.priority, m.group_key,\n       m.depends_on, pgmb.delivery_fair_key(r.fairness_header, m.headers),\n       least(m.expires_at, m.created_at + r.message_ttl * interval '1 second'), m.unique_key\n-- Each message's place in the statement: deliveries are inserted in publish order, which\n-- their ids keep and ordered groups follow (pgmb.hold_delivery); the join below may return\n-- them in any order.\nFROM (SELECT n.id, n.routing_key, n.available_at, n.created_at, n.priority, n.group_key,\n             n.depends_on, n.dedup_id, n.headers, n.expires_at, n.unique_key,\n             row_number() OVER () AS place\n      FROM new_messages AS n) AS m\n-- The queues of each distinct key, decided once per key: a batch's messages mostly\n-- share a few keys. OFFSET 0 keeps the planner from joining the messages in first, which\n-- would compute the key's tags and test the queues once per message again.\nJOIN (SELECT k.routing_key, q.id AS queue_id, q.dedup_window, q.pattern, q.fairness_header,\n             q.message_ttl\n      FROM (SELECT DISTINCT n.routing_key FROM new_messages AS n) AS k\n      -- The key's tags (pgmb.key_tags): OFFSET 0 keeps the subquery a step\n      -- of its own, where inlined into the join condition a scan of a few queues would\n      -- compute them once per queue.\n      CROSS JOIN LATERAL (SELECT pgmb.key_tags(k.routing_key) AS tags OFFSET 0) AS t\n      -- Only a queue whose binding's tags are all tags of the key can match, so few queues\n      -- reach the regex (PostgreSQL caches only 32 compiled regexes per backend; past that\n      -- every match compiles its pattern again). With many queues the first test is a\n      -- lookup in the GIN index pgmb_queue_binding_tags. With a few, scanned, the CASE\n      -- makes the cheap test run first: the regex alone needs only k and q, and the planner\n      -- would otherwise run it on every pair before joining t.\n      JOIN pgmb_queue AS q\n        ON q.binding_tags <@ t.tags\n       AND CASE WHEN q.binding_tags <@ t.tags THEN ('.' || k.routing_key) ~ q.pattern END\n      OFFSET 0) AS r ON r.routing_key = m.routing_key\n-- Not to a queue for which the message is a duplicate (pgmb.admit_message dropped those\n-- that duplicate for every queue): one published before it, not later in this statement.\nWHERE m.dedup_id IS NULL OR r.dedup_window = 0 OR NOT EXISTS (\n    SELECT FROM pgmb.duplicated(r.dedup_window, r.pattern, m.id, m.dedup_id, m.created_at) AS x(id)\n    WHERE NOT EXISTS (SELECT FROM (SELECT l.id, row_number() OVER () AS place FROM new_messages AS l) AS later\n                      WHERE later.id = x.id AND later.place > m.place))\nORDER BY m.place;\nIF FOUND THEN\n    PERFORM pgmb.wake_dispatchers();\nEND IF;\nRETURN NULL;",
                    hash="360d24a1c528c4b9139e9e84415666ddaf3db102",
                    level="STATEMENT",
                    operation="INSERT",
                    pgid="pgtrigger_route_messages_110b5",
                    referencing="REFERENCING NEW TABLE AS new_messages ",
                    table="pgmb_message",
                    when="AFTER",
                ),
            ),
        ),
        # Expiry: a message's expires_at is held to the time rule (pgmb.refuse_expiry) on
        # INSERT and UPDATE; a NULL one leaves both WHENs as they were. Unique while live:
        # admit_message also fires for a message with a unique key or an on_duplicate.
        pgtrigger.migrations.RemoveTrigger(
            model_name="message",
            name="admit_message",
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name="message",
            name="check_message_times",
        ),
        pgtrigger.migrations.AddTrigger(
            model_name="message",
            trigger=pgtrigger.compiler.Trigger(
                name="admit_message",
                sql=pgtrigger.compiler.UpsertTriggerSql(
                    condition="WHEN (NEW.group_key IS NOT NULL OR NEW.depends_on IS NOT NULL OR NEW.dedup_id IS NOT NULL OR NEW.max_retries IS NOT NULL OR NEW.retry_delay IS NOT NULL OR NEW.unique_key IS NOT NULL OR NEW.on_duplicate IS NOT NULL OR NOT (NEW.created_at >= '0001-01-01 00:00:00+00'::timestamptz AND NEW.created_at < '10000-01-01 00:00:00+00'::timestamptz AND NEW.available_at >= '0001-01-01 00:00:00+00'::timestamptz AND NEW.available_at < '10000-01-01 00:00:00+00'::timestamptz AND NEW.expires_at >= '0001-01-01 00:00:00+00'::timestamptz AND NEW.expires_at < '10000-01-01 00:00:00+00'::timestamptz))",
                    func="-- Only messages with an option other than priority, a unique key, or a time\n-- pgmb.valid_time rejects, get here (the trigger's WHEN).\nRETURN pgmb.admit_message(NEW);",
                    hash="8adb8006f4c4d8f639abfd9a4cbf8ca332ff8b27",
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
                name="check_message_times",
                sql=pgtrigger.compiler.UpsertTriggerSql(
                    condition="WHEN (NOT (NEW.created_at >= '0001-01-01 00:00:00+00'::timestamptz AND NEW.created_at < '10000-01-01 00:00:00+00'::timestamptz AND NEW.available_at >= '0001-01-01 00:00:00+00'::timestamptz AND NEW.available_at < '10000-01-01 00:00:00+00'::timestamptz AND NEW.expires_at >= '0001-01-01 00:00:00+00'::timestamptz AND NEW.expires_at < '10000-01-01 00:00:00+00'::timestamptz))",
                    func="-- Only a row with a time pgmb.valid_time rejects gets here (the trigger's WHEN).\nPERFORM pgmb.refuse_expiry(NEW);\nPERFORM pgmb.refuse_times('pgmb_message', NEW.id::text, NEW.created_at, NEW.available_at);\nRETURN NEW;",
                    hash="1bfbedcefa4670cbdf9b895054747549c1210566",
                    operation='UPDATE OF "created_at", "available_at", "expires_at"',
                    pgid="pgtrigger_check_message_times_9f153",
                    table="pgmb_message",
                    when="BEFORE",
                ),
            ),
        ),
        # Archive by day (docs/decisions/0079-the-archive-takes-whole-days.md): the days a
        # run detached, before the SQL, which grants it and whose function records in it.
        migrations.CreateModel(
            name="ArchiveDay",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("day", models.DateField()),
                ("message_table", models.TextField()),
                ("attempt_table", models.TextField()),
                ("kept", models.BigIntegerField(db_default=0, default=0)),
                ("messages", models.BigIntegerField(db_default=0, default=0)),
                ("attempts", models.BigIntegerField(db_default=0, default=0)),
                (
                    "dropped_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="tables dropped"),
                ),
                (
                    "run",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="days",
                        to="pgmb.archiverun",
                    ),
                ),
            ],
            options={
                "verbose_name": "archived day",
                "db_table": "pgmb_archive_day",
                "constraints": [
                    models.UniqueConstraint(fields=("run", "day"), name="pgmb_archive_day_run_day")
                ],
            },
        ),
        # Cancel and run now (docs/decisions/0084-cancel-and-run-now.md): before the SQL,
        # whose functions read the column. Nullable, so adding it writes no row and 0.1.1's
        # statements, which do not name it, keep working; the outcome's new choice fits its
        # 8 characters, so the history is not altered (choices are Django's alone).
        migrations.AlterModelOptions(
            name="delivery",
            options={
                "permissions": [
                    ("cancel_delivery", "Can cancel deliveries"),
                    ("run_delivery", "Can make deliveries due now"),
                ],
                "verbose_name_plural": "deliveries",
            },
        ),
        migrations.AddField(
            model_name="delivery",
            name="canceled_at",
            field=models.DateTimeField(
                blank=True, editable=False, null=True, verbose_name="cancelled at"
            ),
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
                    ("ttl", "expired (TTL)"),
                    ("archived", "archived"),
                    ("canceled", "cancelled"),
                ],
                max_length=8,
            ),
        ),
        # Schedules (docs/decisions/0089-schedules-fired-by-the-loops.md): the table, before
        # the SQL, whose functions take its row type. A new table: 0.1.1's statements never
        # name it.
        migrations.CreateModel(
            name="Schedule",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.TextField(unique=True)),
                ("cron", models.TextField(blank=True, null=True)),
                ("every", models.DurationField(blank=True, null=True)),
                (
                    "timezone",
                    models.TextField(db_default="UTC", default="UTC", verbose_name="time zone"),
                ),
                (
                    "missed",
                    models.TextField(
                        choices=[
                            ("skip", "skip: go on to the next due time after now"),
                            ("once", "once: fire once for the runs missed"),
                            ("all", "all: fire every run missed"),
                        ],
                        db_default="once",
                        default="once",
                        verbose_name="missed runs",
                    ),
                ),
                ("routing_key", models.TextField()),
                ("body", models.JSONField(blank=True)),
                (
                    "headers",
                    models.JSONField(db_default=models.Value({}, models.JSONField()), default=dict),
                ),
                ("task", models.JSONField(blank=True, null=True)),
                ("paused", models.BooleanField(db_default=False, default=False)),
                ("next_run_at", models.DateTimeField(verbose_name="next run")),
                (
                    "last_runs",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.DateTimeField(),
                        blank=True,
                        db_default=[],
                        default=list,
                        size=None,
                    ),
                ),
                ("runs", models.BigIntegerField(db_default=0, default=0)),
                ("last_error", models.TextField(blank=True, null=True)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "schedule",
                "db_table": "pgmb_schedule",
                "ordering": ["name"],
                "permissions": [("pause_schedule", "Can pause and resume schedules")],
                "indexes": [
                    models.Index(
                        condition=models.Q(("paused", False)),
                        fields=["next_run_at"],
                        name="pgmb_schedule_due",
                    )
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(("cron__isnull", False), ("every__isnull", True)),
                            models.Q(("cron__isnull", True), ("every__isnull", False)),
                            _connector="OR",
                        ),
                        name="pgmb_schedule_cron_or_every",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("missed", "skip"),
                            ("missed", "once"),
                            ("missed", "all"),
                            _connector="OR",
                        ),
                        name="pgmb_schedule_missed",
                    ),
                ],
            },
        ),
        RunMigrationSQL("0003_release_0_2_0"),
        # Unique while live: the delivery's trigger, after the SQL that defines its function,
        # so that migrating back drops it before the .down.sql drops the function
        # django-pgtrigger leaves behind.
        pgtrigger.migrations.AddTrigger(
            model_name="delivery",
            trigger=pgtrigger.compiler.Trigger(
                name="admit_unique_key",
                sql=pgtrigger.compiler.UpsertTriggerSql(
                    condition="WHEN (NEW.unique_key IS NOT NULL)",
                    func="-- Only deliveries with a unique key get here (the trigger's WHEN).\nRETURN pgmb.admit_unique_delivery(NEW);",
                    hash="cba0b97baaff9889890a9347ef148ee977ef4ac1",
                    operation="INSERT",
                    pgid="pgtrigger_admit_unique_key_8e3e9",
                    table="pgmb_delivery",
                    when="BEFORE",
                ),
            ),
        ),
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
                    hash="45cb15563b6b6473a0854add2e472d1ff99058c6",
                    # Answers that stop retries: dead_statuses and retried_statuses too. A
                    # cap on requests in flight: max_in_flight.
                    operation=(
                        'UPDATE OF "id", "name", "endpoint", "rps", "timeout", "burst", '
                        '"secret", "active", "created_at", "breaker_failures", "breaker_rate", '
                        '"breaker_window", "breaker_min_requests", "breaker_cooldown", '
                        '"breaker_cooldown_max", "breaker_state", "breaker_since", '
                        '"breaker_until", "breaker_reason", "breaker_streak", "breaker_trips", '
                        '"breaker_probe", "breaker_window_at", "breaker_requests", '
                        '"breaker_failed", "breaker_prev_requests", "breaker_prev_failed", '
                        '"dead_statuses", "retried_statuses", "max_in_flight"'
                    ),
                    pgid="pgtrigger_worker_validate_update_3bb89",
                    table="pgmb_worker",
                    when="BEFORE",
                ),
            ),
        ),
        # Backfill and recover (docs/decisions/0086-backfill-and-recover.md): the admin's
        # actions' permissions. Options only: nothing in the database changes.
        migrations.AlterModelOptions(
            name="queue",
            options={
                "ordering": ["name"],
                "permissions": [
                    ("pause_queue", "Can pause and resume queues"),
                    ("backfill_queue", "Can backfill queues with stored messages"),
                    ("recover_queue", "Can recover the dead letters of queues"),
                ],
            },
        ),
    ]
