from django.db import migrations

from pgmb.sql.operations import RunPlpythonSQL


class Migration(migrations.Migration):
    """The PL/Python transport keeps up to 8 requests of a run in flight (sends a window,
    then reads its answers); migrating back restores 0031's transport."""

    dependencies = [
        ("pgmb", "0032_steady_plans"),
    ]

    operations = [
        RunPlpythonSQL("0033_plpython_windows", restores="0031_plpython_runs"),
    ]
