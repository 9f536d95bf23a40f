# The two commands: `make demo` and `make test`. Everything they need is installed here:
# Debian packages with apt-get (when root; otherwise the missing ones are named), Python
# packages into .venv.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Debian packages the project needs; `make deps` installs the missing ones when root.
# chromium drives the admin's browser tests; libpostgresql-jdbc-java is Spark's JDBC driver;
# valgrind counts instructions for bench/instructions.py; openssl makes the TLS tests' certificate;
# ca-certificates lets scripts/fetch_postgres.py check npm's certificate (a bare Debian lacks it);
# pgbouncer stands in front of the test cluster in tests/pooler.
DEBS := postgresql-15 postgresql-15-cron postgresql-plpython3-15 nginx-light chromium \
	libpostgresql-jdbc-java valgrind openssl ca-certificates pgbouncer

# `make test` runs the whole suite on Debian's PostgreSQL, then these layers on each major of
# PG_MATRIX (builds pinned in scripts/fetch_postgres.py, kept in .cache/postgres): a layer
# added here runs on every major (keep each list on one line: scripts/test-matrix.sh, run
# directly, reads them here). scripts/test-matrix.sh says which PostgreSQL ran what.
CORE_LAYERS := tests/admin tests/dispatch tests/install tests/pull tests/python tests/sql tests/tasks
PG_MATRIX := 14 18

.PHONY: help deps venv test demo bench lint schema extension clean

help:
	@echo "make demo   bring up a local PostgreSQL, migrate the example project, publish and serve the admin"
	@echo "make test   install what the tests need, run the suite on a throwaway PostgreSQL (Debian's),"
	@echo "            then its core layers on PostgreSQL $(PG_MATRIX) (CORE_LAYERS in the Makefile)"
	@echo "make bench  run the benchmarks in bench/ against a throwaway PostgreSQL"
	@echo "            (PGMQ_SQL=path/to/pgmq.sql make bench: also against PGMQ; docs/benchmarks.md)"
	@echo "make schema copy pgmb/sql/schema/ into the unreleased migration's frozen SQL files"
	@echo "make extension  write the PostgreSQL extension (CREATE EXTENSION pgmb) into build/extension"
	@echo "make lint   ruff and mypy"

deps:
	@scripts/deps.sh $(DEBS)

$(VENV)/.installed: setup.cfg pyproject.toml
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { scripts/deps.sh python3-venv && rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test,spark]'
	@touch $@

venv: $(VENV)/.installed

test: deps venv
	@CORE_LAYERS='$(CORE_LAYERS)' PG_MATRIX='$(PG_MATRIX)' scripts/test-matrix.sh

demo: deps venv
	@scripts/demo.sh

bench: deps venv
	@scripts/with-cluster.sh sh -c '$(PY) bench/publish.py && $(PY) bench/pgbench_publish.py && $(PY) bench/instructions.py && $(PY) bench/dispatch.py && $(PY) bench/reconnect.py && $(PY) bench/scale.py && $(PY) bench/pull.py && $(PY) bench/tasks.py'

schema: venv
	$(VENV)/bin/python scripts/freeze_schema.py

# Written from the release migrations (pgmb/extension.py); a throwaway server quotes their
# statements' values. Then, as root: cp build/extension/* "$$(pg_config --sharedir)/extension/"
extension: deps venv
	@scripts/with-cluster.sh $(PY) -m pgmb extension build/extension

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info .cache
