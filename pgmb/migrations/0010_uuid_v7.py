import django.db.models
from django.db import migrations

import pgmb.ids
from pgmb.sql.operations import RunMigrationSQL


class Migration(migrations.Migration):
    """Time-ordered message ids: pgmb.uuid_v7() in SQL (the column's default) and
    pgmb.ids.uuid7 in Python."""

    dependencies = [
        ("pgmb", "0009_replay"),
    ]

    operations = [
        migrations.AlterField(
            model_name="message",
            name="id",
            field=django.db.models.UUIDField(
                default=pgmb.ids.uuid7, editable=False, primary_key=True, serialize=False
            ),
        ),
        RunMigrationSQL("0010_uuid_v7"),
    ]
