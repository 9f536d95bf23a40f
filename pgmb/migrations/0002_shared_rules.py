from django.db import migrations, models

import pgmb.models
from pgmb.sql.operations import RunMigrationSQL


class Migration(migrations.Migration):
    dependencies = [("pgmb", "0001_initial")]

    operations = [
        migrations.AlterField(
            model_name="worker",
            name="secret",
            field=models.CharField(
                blank=True,
                help_text="Signs requests the Standard Webhooks way.",
                max_length=200,
                validators=[pgmb.models.validate_secret],
            ),
        ),
        RunMigrationSQL("0002_shared_rules"),
    ]
