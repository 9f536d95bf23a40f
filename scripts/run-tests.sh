#!/usr/bin/env bash
# The suite: lint, type check (mypy, configured in pyproject.toml), migrations in sync with
# the models, then pytest (real PostgreSQL from the environment, see scripts/with-cluster.sh).
# `make test` runs it on Debian's PostgreSQL, and more on other majors (scripts/test-matrix.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
export PYTHONPATH=$PWD DJANGO_SETTINGS_MODULE=tests.settings
$bin/ruff check .
$bin/mypy
# The stand-in for pgsql-http (tests/pg_http) goes into the server's extension folder for
# the run, which is put back as it was found afterwards (a stand-in that was there stays, one
# that was not goes; a real pgsql-http is left alone).
if [ "$(id -u)" = 0 ]; then
  sharedir=$(psql -X -tA -v ON_ERROR_STOP=1 -c "SELECT setting FROM pg_config WHERE name = 'SHAREDIR'")
  saved=$(mktemp -d "${TMPDIR:-/tmp}/pgmb-http-standin.XXXXXX")
  trap 'tests/pg_http/install.sh --restore "$saved/files" "$sharedir" && rm -rf "$saved"' EXIT
  tests/pg_http/install.sh --save "$saved/files" "$sharedir" >/dev/null
fi
$bin/python -m django makemigrations --check --dry-run pgmb
$bin/python -m pytest -q "$@"
