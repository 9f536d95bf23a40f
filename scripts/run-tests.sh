#!/usr/bin/env bash
# The suite: lint, type check (mypy, configured in pyproject.toml), migrations in sync with
# the models, then pytest (real PostgreSQL from the environment, see scripts/with-cluster.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
export PYTHONPATH=$PWD DJANGO_SETTINGS_MODULE=tests.settings
$bin/ruff check .
$bin/mypy
# The stand-in for pgsql-http (tests/pg_http) goes into PostgreSQL's extension folder for
# the run, and out again afterwards (a real pgsql-http found there is left alone).
if [ "$(id -u)" = 0 ]; then
  tests/pg_http/install.sh >/dev/null
  trap 'tests/pg_http/install.sh --remove >/dev/null' EXIT
fi
$bin/python -m django makemigrations --check --dry-run pgmb
$bin/python -m pytest -q "$@"
