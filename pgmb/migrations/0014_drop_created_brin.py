from django.db import migrations

from pgmb.sql.operations import RunMigrationSQL


class Migration(migrations.Migration):
    """The dashboard's BRIN index of message times goes: 0013's B-tree serves it."""

    dependencies = [
        ("pgmb", "0013_list_indexes"),
    ]

    operations = [
        RunMigrationSQL("0014_drop_created_brin"),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="message", name="pgmb_message_created_brin"),
            ],
        ),
    ]
