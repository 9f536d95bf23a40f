from django.db import migrations

from pgmb import sql


class Migration(migrations.Migration):
    """The SQL core: name and routing rules, table defaults and checks, the seed's API."""

    dependencies = [("pgmb", "0001_initial")]

    operations = [
        migrations.RunSQL(sql.script("routing.sql"), sql.script("uninstall.sql")),
        migrations.RunSQL(sql.script("tables.sql"), sql.script("tables.down.sql")),
        migrations.RunSQL(sql.script("catalog.sql"), migrations.RunSQL.noop),
        migrations.RunSQL(sql.script("api.sql"), migrations.RunSQL.noop),
    ]
