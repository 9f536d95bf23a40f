"""Django settings of bench/tasks.py: one project per task system, chosen by
``PGMB_BENCH_TASKS_SYSTEM`` (``pgmb``, ``django_tasks_db`` or ``procrastinate``).

Each system gets only its own apps and its own database (``PGMB_BENCH_DB``) on the server of
the libpq variables, as bench/settings.py; the no-op task lives in bench/tasks_noop.py.
"""

import os

import django

from bench.settings import DATABASES, DEFAULT_AUTO_FIELD, SECRET_KEY, TIME_ZONE, USE_TZ

SYSTEM = os.environ.get("PGMB_BENCH_TASKS_SYSTEM", "pgmb")

__all__ = ["DATABASES", "DEFAULT_AUTO_FIELD", "SECRET_KEY", "TIME_ZONE", "USE_TZ"]

# The framework: Django 6's own, or on Django 5.2 its backport, an app.
FRAMEWORK = ["django_tasks"] if django.VERSION < (6,) else []
INSTALLED_APPS: list[str] = FRAMEWORK
TASKS: dict = {}
if SYSTEM == "pgmb":
    INSTALLED_APPS = [*FRAMEWORK, "pgtrigger", "pgmb"]
    TASKS = {"default": {"BACKEND": "pgmb.tasks.PgmbBackend"}}
    PGMB: dict = {}
elif SYSTEM == "django_tasks_db":
    INSTALLED_APPS = [*FRAMEWORK, "django_tasks_db"]
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
elif SYSTEM == "procrastinate":
    INSTALLED_APPS = ["procrastinate.contrib.django"]
    PROCRASTINATE_IMPORT_PATHS = ["bench.tasks_noop"]
else:
    raise ValueError(f"PGMB_BENCH_TASKS_SYSTEM={SYSTEM!r}: pgmb, django_tasks_db or procrastinate")
