"""Django settings of the benchmarks: the smallest project that can migrate and publish.

The server comes from the libpq variables (``PGHOST``, ``PGPORT``, ``PGUSER``,
``PGPASSWORD``), as ``scripts/with-cluster.sh`` exports them. The database is a scratch one
that the benchmark creates and drops (``PGMB_BENCH_DB``, default ``pgmb_bench``), never
``PGDATABASE`` itself, so a run leaves nothing behind.
"""

import os

SECRET_KEY = "bench-only"  # no request is ever served
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["pgtrigger", "pgmb"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("PGPORT", "5432"),
        "USER": os.environ.get("PGUSER", "postgres"),
        "PASSWORD": os.environ.get("PGPASSWORD", ""),
        "NAME": os.environ.get("PGMB_BENCH_DB", "pgmb_bench"),
        # One connection per process for the whole run, as a long-lived producer has.
        "CONN_MAX_AGE": None,
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PGMB: dict = {}
# bench/scale.py --no-dispatcher-housekeeping: the drain leaves the indexes as they grew.
if os.environ.get("PGMB_BENCH_HOUSEKEEPING_INTERVAL"):
    PGMB["HOUSEKEEPING_INTERVAL"] = float(os.environ["PGMB_BENCH_HOUSEKEEPING_INTERVAL"])
