from django.db import migrations, models

import pgmb.models
from pgmb.sql.operations import RunMigrationSQL


class Migration(migrations.Migration):
    dependencies = [("pgmb", "0002_delivery_api")]

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
        RunMigrationSQL("0003_shared_rules"),
    ]
