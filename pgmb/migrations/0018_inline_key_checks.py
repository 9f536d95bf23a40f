from django.db import migrations

from pgmb.sql.operations import RunMigrationSQL


class Migration(migrations.Migration):
    """The key rules' SQL functions without STRICT, so that the routing-key CHECK of
    pgmb_message is inlined (same results)."""

    dependencies = [
        ("pgmb", "0017_waiting_dispatchers"),
    ]

    operations = [
        RunMigrationSQL("0018_inline_key_checks"),
    ]
