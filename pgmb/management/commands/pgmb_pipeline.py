"""``manage.py pgmb_pipeline JOB …``: a Spark job of :mod:`pgmb.pipeline` on this project's
database.

    manage.py pgmb_pipeline archive --output /data/pgmb-archive
    manage.py pgmb_pipeline stats
    manage.py pgmb_pipeline publish events.parquet --key-column topic --body-column payload
    manage.py pgmb_pipeline --database other archive --master spark://host:7077 …

The database is Django's (``--database``, default ``PGMB["DATABASE"]``) unless ``--dsn``
names another; every other option is the job's own (``manage.py pgmb_pipeline JOB -h``).
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.utils.connection import ConnectionDoesNotExist
from psycopg.conninfo import make_conninfo

from pgmb import conf
from pgmb.errors import PipelineError
from pgmb.pipeline import cli

# Django's connection settings and the libpq keywords they become.
_LIBPQ = {"HOST": "host", "PORT": "port", "NAME": "dbname", "USER": "user", "PASSWORD": "password"}


def dsn(alias: str) -> str:
    """The libpq connection string of Django database ``alias``."""
    try:
        settings = connections[alias].settings_dict
    except ConnectionDoesNotExist:
        raise CommandError(f"no database {alias!r} in DATABASES") from None
    params = {key: str(settings[k]) for k, key in _LIBPQ.items() if settings.get(k)}
    for key, value in (settings.get("OPTIONS") or {}).items():
        if isinstance(value, str | int):
            params[key] = str(value)
    return make_conninfo(**params)


class Command(BaseCommand):
    help = "Run a pgmb Spark job (archive, stats, publish) on this project's database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", help="Django database alias (default: PGMB['DATABASE'])")
        parser.add_argument("job_args", nargs=argparse.REMAINDER, metavar="JOB …")

    def handle(self, *args: Any, database: str | None, job_args: list[str], **_: Any) -> None:
        options = cli.parser("manage.py pgmb_pipeline").parse_args(job_args)
        try:
            cli.refuse_password_in_dsn(options)
        except PipelineError as e:
            raise CommandError(str(e), returncode=2) from None
        # Django's password goes to the job in-process, never on a command line.
        if options.dsn is None:
            options.dsn = dsn(database or conf.get().DATABASE)
        if options.job == "archive" and options.older_than is None:
            options.older_than = conf.get().PIPELINE_ARCHIVE_OLDER_THAN_DAYS
        try:
            code = cli.run(options, self.stdout)
        except PipelineError as e:
            raise CommandError(str(e), returncode=2) from None
        if code:
            raise CommandError(f"{options.job} failed", returncode=code)
