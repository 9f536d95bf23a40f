import django.core.validators
from django.db import migrations, models

import pgmb.models
from pgmb.sql.operations import RunMigrationSQL


class Migration(migrations.Migration):
    """A circuit breaker per worker: its settings and state on pgmb_worker (constant
    defaults: no rewrite), pgmb.breaker_settle called by pgmb.ack and
    pgmb.settle_failures, pgmb.breaker_admit by pgmb.claim, pgmb.breaker_reset, the
    settings checked by pgmb.prepare_worker."""

    dependencies = [
        ("pgmb", "0021_access_control"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="breaker_cooldown",
            field=models.FloatField(
                db_default=30.0,
                default=30.0,
                help_text="How long an open breaker holds the worker's deliveries before a probe.",
                validators=[
                    pgmb.models.validate_finite,
                    pgmb.models.validate_positive,
                    django.core.validators.MaxValueValidator(86400),
                ],
                verbose_name="cool-down (s)",
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_cooldown_max",
            field=models.FloatField(
                db_default=600.0,
                default=600.0,
                help_text="Each failed probe doubles the cool-down, up to this.",
                validators=[
                    pgmb.models.validate_finite,
                    pgmb.models.validate_positive,
                    django.core.validators.MaxValueValidator(86400),
                ],
                verbose_name="cool-down cap (s)",
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_failed",
            field=models.IntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_failures",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Empty or 0: no limit on failures in a row.",
                null=True,
                validators=[django.core.validators.MaxValueValidator(1000000)],
                verbose_name="open after failures in a row",
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_min_requests",
            field=models.PositiveIntegerField(
                db_default=20,
                default=20,
                help_text="The rate counts once the window holds at least this many requests.",
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(1000000),
                ],
                verbose_name="rate from requests",
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_prev_failed",
            field=models.IntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_prev_requests",
            field=models.IntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_probe",
            field=models.UUIDField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_rate",
            field=models.FloatField(
                blank=True,
                help_text="A share of the window's requests, above 0 and at most 1 (0.5: half of them failed). Empty: no rate limit.",
                null=True,
                validators=[
                    pgmb.models.validate_finite,
                    pgmb.models.validate_positive,
                    django.core.validators.MaxValueValidator(1),
                ],
                verbose_name="open at failure rate",
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_reason",
            field=models.TextField(db_default="", default="", editable=False),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_requests",
            field=models.IntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_since",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_state",
            field=models.CharField(
                choices=[("closed", "closed"), ("open", "open"), ("half_open", "half-open")],
                db_default="closed",
                default="closed",
                editable=False,
                max_length=9,
                verbose_name="breaker",
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_streak",
            field=models.IntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_trips",
            field=models.IntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_until",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_window",
            field=models.FloatField(
                db_default=60.0,
                default=60.0,
                validators=[
                    pgmb.models.validate_finite,
                    pgmb.models.validate_positive,
                    django.core.validators.MaxValueValidator(86400),
                ],
                verbose_name="rate window (s)",
            ),
        ),
        migrations.AddField(
            model_name="worker",
            name="breaker_window_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        RunMigrationSQL("0022_circuit_breaker"),
    ]
