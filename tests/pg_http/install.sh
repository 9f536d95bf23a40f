#!/usr/bin/env bash
# Install the pgsql-http stand-in (extension "http", PL/Python) into PostgreSQL's extension
# folder, so that tests can run CREATE EXTENSION http. Safe to run again and again.
#
#   tests/pg_http/install.sh [SHAREDIR]                 install (or update) it
#   tests/pg_http/install.sh --save DIR [SHAREDIR]      the same, first keeping in DIR (a new,
#                                                       empty folder) how the files were
#   tests/pg_http/install.sh --restore DIR [SHAREDIR]   put them back as DIR says they were
#   tests/pg_http/install.sh --remove [SHAREDIR]        remove it again (never a real pgsql-http)
#
# --save and --restore are how the test runs leave the extension folder exactly as they
# found it: a stand-in that was there stays (even an outdated one), one that was not goes.
# SHAREDIR (or $PG_SHAREDIR) is PostgreSQL's share directory. Otherwise it is asked of
# $PG_BINDIR/pg_config (the server scripts/pgcluster.sh would start), then of pg_config on
# the PATH, and failing both it is /usr/share/postgresql/<newest /usr/lib/postgresql/*>.
# A real pgsql-http found there is left alone. Writing there usually needs root.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
marker=pgmb-standin
files=(http.control http--1.6.sql)

remove=
save=
restore=
case "${1:-}" in
  --remove)
    remove=1
    shift
    ;;
  --save)
    save=${2:?install.sh: --save needs a folder}
    shift 2
    ;;
  --restore)
    restore=${2:?install.sh: --restore needs a folder}
    shift 2
    ;;
esac
sharedir=${1:-${PG_SHAREDIR:-}}
if [ -z "$sharedir" ] && [ -n "${PG_BINDIR:-}" ] && [ -x "$PG_BINDIR/pg_config" ]; then
  sharedir=$("$PG_BINDIR/pg_config" --sharedir)
fi
if [ -z "$sharedir" ] && command -v pg_config >/dev/null 2>&1; then
  sharedir=$(pg_config --sharedir)
fi
if [ -z "$sharedir" ]; then
  newest=$(ls -d /usr/lib/postgresql/*/ 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$newest" ]; then
    echo "pg_http/install.sh: no pg_config and no /usr/lib/postgresql/<version>: is PostgreSQL installed? ('make deps' as root installs it)" >&2
    exit 1
  fi
  sharedir=/usr/share/postgresql/$(basename "$newest")
fi
extdir=$sharedir/extension
if [ ! -f "$extdir/plpgsql.control" ]; then
  echo "pg_http/install.sh: $extdir is not a PostgreSQL extension folder (no plpgsql.control); pass the share directory as argument" >&2
  exit 1
fi

if [ -n "$restore" ]; then
  # DIR holds a copy of each file that was there and a "<file>.absent" for each that was not.
  for f in "${files[@]}"; do
    if [ ! -f "$restore/$f" ] && [ ! -f "$restore/$f.absent" ]; then
      echo "pg_http/install.sh: $restore was not written by --save; $extdir left as it is" >&2
      exit 1
    fi
  done
  for f in "${files[@]}"; do
    if [ -f "$restore/$f" ]; then
      cmp -s "$restore/$f" "$extdir/$f" || cp -p "$restore/$f" "$extdir/$f"
    else
      rm -f "$extdir/$f"
    fi
  done
  exit 0
fi

if [ -n "$save" ]; then
  mkdir -p "$save"
  if [ -n "$(ls -A "$save")" ]; then
    echo "pg_http/install.sh: --save needs an empty folder; $save is not" >&2
    exit 1
  fi
  for f in "${files[@]}"; do
    if [ -f "$extdir/$f" ]; then cp -p "$extdir/$f" "$save/$f"; else : >"$save/$f.absent"; fi
  done
fi

if [ -n "$remove" ]; then
  if [ -f "$extdir/http.control" ] && grep -q "$marker" "$extdir/http.control"; then
    for f in "${files[@]}"; do rm -f "$extdir/$f"; done
    echo "pg_http/install.sh: removed the http stand-in from $extdir"
  fi
  exit 0
fi

if [ -f "$extdir/http.control" ] && ! grep -q "$marker" "$extdir/http.control"; then
  echo "pg_http/install.sh: the real pgsql-http is installed in $extdir; leaving it (the tests use it)"
  exit 0
fi

missing=()
for f in "${files[@]}"; do
  cmp -s "$here/$f" "$extdir/$f" || missing+=("$f")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "pg_http/install.sh: the http stand-in is up to date in $extdir"
  exit 0
fi

if [ ! -w "$extdir" ]; then
  echo "pg_http/install.sh: cannot write to $extdir; run it as root (sudo $0) to install the http stand-in (${missing[*]})" >&2
  exit 1
fi
for f in "${missing[@]}"; do
  install -m 0644 "$here/$f" "$extdir/$f"
done
echo "pg_http/install.sh: installed the http stand-in (${missing[*]}) into $extdir"
