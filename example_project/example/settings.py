"""Settings of the pgmb example project: a shop whose orders publish messages.

The database is named by the libpq environment variables, so the same settings serve the
demo cluster of ``make demo`` and any other PostgreSQL:

    PGHOST (127.0.0.1)  PGPORT (5432)  PGUSER (postgres)  PGPASSWORD ()  PGDATABASE (pgmb_demo)

PGHOST and PGPORT may name a PgBouncer in transaction mode: pgmb finds out by itself and
needs no setting for it, and polls. PGMB_DIRECT_PGHOST and PGMB_DIRECT_PGPORT, when set,
name the PostgreSQL server behind it (the other variables as above), where pgmb's processes
LISTEN and do housekeeping (docs/operations.md, "PgBouncer (transaction pooling)").
"""

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "pgmb-example-not-a-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") != "0"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # pgmb installs its routing trigger with django-pgtrigger.
    "pgtrigger",
    "pgmb",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example.urls"
WSGI_APPLICATION = "example.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("PGHOST") or "127.0.0.1",
        "PORT": os.environ.get("PGPORT") or "5432",
        "USER": os.environ.get("PGUSER") or "postgres",
        "PASSWORD": os.environ.get("PGPASSWORD", ""),
        "NAME": os.environ.get("PGDATABASE") or "pgmb_demo",
    }
}
# The same database without PgBouncer, when the environment names it (see above).
DIRECT = bool(os.environ.get("PGMB_DIRECT_PGHOST") or os.environ.get("PGMB_DIRECT_PGPORT"))
if DIRECT:
    DATABASES["direct"] = {
        **DATABASES["default"],
        "HOST": os.environ.get("PGMB_DIRECT_PGHOST") or DATABASES["default"]["HOST"],
        "PORT": os.environ.get("PGMB_DIRECT_PGPORT") or "5432",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
USE_I18N = True

STATIC_URL = "static/"

# Every pgmb setting, at its default value. Leave out the ones you do not change.
PGMB = {
    # The database alias pgmb publishes to and dispatches from.
    "DATABASE": "default",
    # Encodes message bodies and headers (dates, decimals and UUIDs become strings).
    "JSON_ENCODER": "django.core.serializers.json.DjangoJSONEncoder",
    # Messages per INSERT when `manage.py pgmb_send --file` publishes in bulk.
    "SEND_BATCH_SIZE": 1000,
    # The external dispatcher, `manage.py pgmb_dispatch`: requests in flight, deliveries per
    # claim, longest sleep between polls without a notification, and how often it takes
    # back the leases of dispatchers that died.
    "DISPATCH_CONCURRENCY": 64,
    "DISPATCH_BATCH": 100,
    "DISPATCH_POLL_INTERVAL": 1.0,
    "DISPATCH_RECLAIM_INTERVAL": 5.0,
    # How long `pgmb_dispatch --until-idle` waits for an unreachable database, in seconds.
    "DISPATCH_GIVE_UP": 30.0,
    # Seconds between a dispatcher's heartbeats (the admin's Dispatchers list; at most 20).
    "DISPATCH_HEARTBEAT_INTERVAL": 5.0,
    # Bytes of a failed response's body kept in the attempt log.
    "RESPONSE_BODY_LIMIT": 500,
    # Lets Prometheus read /metrics with `Authorization: Bearer <token>` (empty: only
    # logged-in staff users may); 16 or more printable ASCII characters, no blanks.
    "METRICS_TOKEN": os.environ.get("PGMB_METRICS_TOKEN", ""),
    # Seconds after which the admin's dashboard reloads itself (0: never).
    "DASHBOARD_REFRESH": 30,
    # `manage.py pgmb_pipeline archive` without --older-than: finished messages older than
    # this many days go to the Parquet archive (the Spark pipeline).
    "PIPELINE_ARCHIVE_OLDER_THAN_DAYS": 7.0,
    # History partitioned by day: days of partitions made ahead by housekeeping, and the
    # age after which `manage.py pgmb_history retire` drops a day (None: only when asked
    # with --older-than).
    "HISTORY_PREMAKE_DAYS": 3,
    "HISTORY_RETENTION_DAYS": None,
    # pgmb_delivery's indexes after a backlog: `pgmb_dispatch` rebuilds those larger than
    # 1 MB and than 4 times what the live rows need, once it has drained work, at most once
    # an hour (0: never; `manage.py pgmb_housekeeping` does it on demand).
    "HOUSEKEEPING_INTERVAL": 3600.0,
    "HOUSEKEEPING_MIN_INDEX_BYTES": 1024 * 1024,
    "HOUSEKEEPING_BLOAT_FACTOR": 4.0,
    # pgmb_dispatch vacuums pgmb_delivery each time it has drained its work, once it claimed
    # this many deliveries since its last vacuum (0: never; autovacuum alone).
    "HOUSEKEEPING_VACUUM_EVERY": 1000,
    # The networks endpoints may reach, checked on the address connected to: the demo's
    # workers are served on loopback, which the default allows (it refuses link-local). For
    # endpoints registered by untrusted users: pgmb.conf.UNTRUSTED_ENDPOINTS.
    "ENDPOINT_POLICY": {"allow": [], "deny": ["169.254.0.0/16", "fe80::/10"]},
    # Behind PgBouncer in transaction mode, the alias of the same database without it, where
    # pgmb's processes LISTEN and do housekeeping (without one they poll, and leave
    # housekeeping to a direct connection): set from PGMB_DIRECT_PGHOST/PGMB_DIRECT_PGPORT.
    "DIRECT_DATABASES": {"default": "direct"} if DIRECT else {},
}
