#!/usr/bin/env bash
# `make test`: the whole suite on Debian's PostgreSQL (scripts/run-tests.sh: lint, types,
# migrations, pytest), then the core layers on each other major of the matrix, each run on
# its own throwaway cluster (scripts/with-cluster.sh).
#
#   scripts/test-matrix.sh [PYTEST ARGS]   (arguments go to the main run's pytest)
#
#   CORE_LAYERS  the layers run on every major    } set in the Makefile, read from it when
#   PG_MATRIX    the other majors                 } not in the environment
#                (their builds: scripts/fetch_postgres.py pins and fetches them)
#   PGMB_PG_CACHE  where those builds are kept (default .cache/postgres, which git ignores)
#
# A failed run does not stop the next one. At the end a summary says which PostgreSQL
# ran what and how it went. The exit status is non-zero when a run failed, or when a
# PostgreSQL extension folder is not as it was found (the http stand-in must not stay behind).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=$root/.venv/bin/python
# The lists live in the Makefile only; run directly, this reads them there.
core=${CORE_LAYERS:-$(sed -n 's/^CORE_LAYERS := //p' Makefile)}
matrix=${PG_MATRIX:-$(sed -n 's/^PG_MATRIX := //p' Makefile)}
cache=${PGMB_PG_CACHE:-$root/.cache/postgres}
if [ -z "${PGMB_PG_CACHE:-}" ] && [ "$(id -u)" = 0 ] && ! runuser -u postgres -- test -x "$root"; then
  # As root the servers run as the postgres system user, who must reach the builds.
  cache=/var/cache/pgmb/postgres
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/pgmb-matrix.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
summary=()
failed=0

# Every file of an extension folder with its mode and checksum: what "as found" means.
listing() {
  (cd "$1" && find . -printf '%p %y %m\n' | sort && find . -type f -print0 | sort -z | xargs -0r sha256sum)
}

# The extension folder of the server in bin folder $1: pg_config says where it has one; the
# builds of scripts/fetch_postgres.py have none, and keep PostgreSQL's own layout.
extension_folder() {
  if [ -x "$1/pg_config" ]; then
    echo "$("$1/pg_config" --sharedir)/extension"
  else
    echo "$(cd "$1/.." && pwd)/share/postgresql/extension"
  fi
}

# run LABEL BINDIR COMMAND...: COMMAND against a throwaway cluster of the server in BINDIR.
run() {
  local label=$1 bindir=$2 ext version started status outcome
  shift 2
  ext=$(extension_folder "$bindir")
  version=$("$bindir/postgres" --version | sed 's/^postgres (PostgreSQL) //')
  listing "$ext" >"$scratch/before"
  echo "=== PostgreSQL $version: $label"
  started=$SECONDS
  PG_BINDIR=$bindir scripts/with-cluster.sh "$@"
  status=$?
  outcome=passed
  [ $status = 0 ] || { outcome="FAILED (exit $status)"; failed=1; }
  if ! listing "$ext" | diff -u "$scratch/before" - >"$scratch/diff"; then
    echo "test-matrix: the run changed $ext:" >&2
    cat "$scratch/diff" >&2
    outcome="$outcome; CHANGED $ext"
    failed=1
  fi
  summary+=("PostgreSQL $version: $label: $outcome ($(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s)")
}

debian=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$debian" ]; then
  echo "test-matrix: no PostgreSQL in /usr/lib/postgresql; run 'make deps' as root" >&2
  exit 1
fi
run "the whole suite${1:+ ($*)}" "$debian" scripts/run-tests.sh "$@"

for major in $matrix; do
  if ! bindir=$("$py" scripts/fetch_postgres.py "$major" "$cache"); then
    summary+=("PostgreSQL $major: could not fetch its build: FAILED")
    failed=1
    continue
  fi
  # Browser and Spark tests exercise Django and Spark, not the server: once, on Debian's, is enough.
  # shellcheck disable=SC2086 # $core is a list of layers
  run "$core (not browser, not spark)" "$bindir" env PYTHONPATH="$root" \
    DJANGO_SETTINGS_MODULE=tests.settings "$py" -m pytest -q -m 'not browser and not spark' $core
done

echo
echo "=== make test: what ran where"
printf '  %s\n' "${summary[@]}"
exit $failed
