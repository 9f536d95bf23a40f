"""Settings of the test suite: a real PostgreSQL named by the libpq variables."""

import os

SECRET_KEY = "tests-only"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # The admin's CSS and JavaScript, served by the live server of the browser tests.
    "django.contrib.staticfiles",
    "pgtrigger",
    "pgmb",
    # Django's Tasks framework (the backport on Django 5.2): pgmb.tasks (tests/tasks).
    "django_tasks",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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
ROOT_URLCONF = "tests.urls"
STATIC_URL = "static/"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("PGPORT", "5432"),
        "USER": os.environ.get("PGUSER", "postgres"),
        "PASSWORD": os.environ.get("PGPASSWORD", ""),
        # The test database is "test_<NAME>": pg_cron's database in the test cluster.
        "NAME": os.environ.get("PGMB_DB_NAME", "postgres"),
        "TEST": {"NAME": os.environ.get("PGMB_TEST_DB", "test_pgmb")},
    },
}
# A second PostgreSQL database on the same server, for one dispatcher serving several
# (tests/dispatch/test_databases.py). pytest-django creates a test database only for the
# aliases some collected test asks for (django_db(databases=...)): runs without those tests
# never create or migrate it.
DATABASES["second"] = {
    **DATABASES["default"],
    "NAME": os.environ.get("PGMB_SECOND_DB_NAME", "postgres"),
    "TEST": {"NAME": DATABASES["default"]["TEST"]["NAME"] + "_second"},
}
# Processes of tests/pooler started through PgBouncer (PGPORT its port) are given the test
# cluster's own port here: an alias of the same database without the pooler.
if os.environ.get("PGMB_TEST_DIRECT_PORT"):
    DATABASES["direct"] = {**DATABASES["default"], "PORT": os.environ["PGMB_TEST_DIRECT_PORT"]}
# Not PostgreSQL: what pgmb refuses to serve. No test connects to it.
DATABASES["lite"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PGMB: dict = {}
# Subprocess dispatchers of the tests beat faster than the default (tests/dispatch).
if os.environ.get("PGMB_TEST_HEARTBEAT_INTERVAL"):
    PGMB["DISPATCH_HEARTBEAT_INTERVAL"] = float(os.environ["PGMB_TEST_HEARTBEAT_INTERVAL"])
# ... and rebuild indexes a small test backlog leaves (tests/dispatch/test_housekeeping.py).
if os.environ.get("PGMB_TEST_HOUSEKEEPING_MIN_INDEX_BYTES"):
    PGMB["HOUSEKEEPING_MIN_INDEX_BYTES"] = int(os.environ["PGMB_TEST_HOUSEKEEPING_MIN_INDEX_BYTES"])
# ... and, through PgBouncer, LISTEN and housekeep on the cluster directly (tests/pooler).
if os.environ.get("PGMB_TEST_DIRECT_PORT"):
    PGMB["DIRECT_DATABASES"] = {"default": "direct"}

# Tasks run through pgmb (tests/tasks); "immediate" is another backend's, for contrast.
TASKS = {
    "default": {"BACKEND": "pgmb.tasks.PgmbBackend", "QUEUES": ["default", "emails"]},
    "immediate": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend"},
}
