"""``python -m pgmb extension FOLDER``: write pgmb's PostgreSQL extension (pgmb.control and
its scripts, pgmb/extension.py) for a database without Django; then, as root, copy them
into ``$(pg_config --sharedir)/extension``. Run inside a Django project (its settings in
DJANGO_SETTINGS_MODULE) or without one: Django is then set up with pgmb alone and connects
where libpq's PG* variables say (database PGDATABASE, else postgres), only to quote the
statements' values as the server would: nothing is written there."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _setup() -> None:
    import django
    from django.conf import settings

    if not os.environ.get("DJANGO_SETTINGS_MODULE") and not settings.configured:
        settings.configure(
            INSTALLED_APPS=[
                "django.contrib.contenttypes",
                "django.contrib.auth",
                "pgtrigger",
                "pgmb",
            ],
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": os.environ.get("PGDATABASE", "postgres"),
                }
            },
            USE_TZ=True,
        )
    django.setup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pgmb", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    ext = commands.add_parser("extension", help="write the extension's control file and scripts")
    ext.add_argument("folder", type=Path, help="where to write them (made if missing)")
    options = parser.parse_args(argv)
    _setup()
    from . import extension

    for path in extension.write(options.folder):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
