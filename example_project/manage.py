#!/usr/bin/env python
"""The example project's manage.py; works from any directory, e.g. from the repository root:

    python example_project/manage.py demo_setup

The database comes from the libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD,
PGDATABASE); ``scripts/demo.sh`` (``make demo``) sets them for its local cluster.
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def main() -> None:
    # The repository first, so that this checkout's pgmb is used even where it is not
    # installed (or another version is); then this folder, for the example's own packages.
    for path in (str(HERE), str(REPO)):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
