#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests, benchmarks and the demo.
#
#   scripts/pgcluster.sh start DIR [PORT]   init (once) and start; prints "export PG…" lines
#   scripts/pgcluster.sh stop DIR           stop (the data stays)
#   scripts/pgcluster.sh restart DIR        restart a running cluster (fast shutdown)
#   scripts/pgcluster.sh destroy DIR        stop and delete
#   scripts/pgcluster.sh env DIR            print the "export PG…" lines of a running cluster
#
# The server is the newest /usr/lib/postgresql/*/bin, or the one in $PG_BINDIR (such as a
# build of scripts/fetch_postgres.py). Where that build has pg_cron, the cluster preloads it
# (pointed at $PGMB_CRON_DB, default "test_pgmb", which is created at start so pg_cron's
# launcher always finds it). It listens on 127.0.0.1 and on a socket inside DIR. initdb
# refuses to run as root, so as root the server runs as the "postgres" system user, and DIR
# and the server's files must be reachable by that user.
set -euo pipefail

cmd=${1:?usage: pgcluster.sh start|stop|restart|destroy|env DIR [PORT]}
dir=${2:?usage: pgcluster.sh start|stop|restart|destroy|env DIR [PORT]}
cron_db=${PGMB_CRON_DB:-test_pgmb}

bindir=${PG_BINDIR:-}
if [ -z "$bindir" ]; then
  bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
fi
if [ -z "$bindir" ] || [ ! -x "$bindir/pg_ctl" ]; then
  echo "pgcluster: no PostgreSQL server found (set PG_BINDIR); run 'make deps' as root" >&2
  exit 1
fi

# The server's library folder: pg_config says, where the build has one; otherwise it is
# lib/postgresql (PostgreSQL's own layout) or lib (Debian's) beside bin.
pkglibdir() {
  if [ -x "$bindir/pg_config" ]; then
    "$bindir/pg_config" --pkglibdir
  elif [ -d "$bindir/../lib/postgresql" ]; then
    echo "$bindir/../lib/postgresql"
  else
    echo "$bindir/../lib"
  fi
}

as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

print_env() {
  local port
  port=$(sed -n 's/^port = \([0-9]*\).*/\1/p' "$dir/data/postgresql.auto.conf" | tail -n 1)
  echo "export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGPASSWORD= PGDATABASE=$cron_db"
}

case "$cmd" in
  start)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [ "$(id -u)" = 0 ]; then
      if ! runuser -u postgres -- test -x "$bindir/postgres"; then
        echo "pgcluster: $bindir/postgres cannot be run by the postgres user (a parent folder is private); put the build elsewhere" >&2
        exit 1
      fi
      chown postgres: "$dir"
      if ! runuser -u postgres -- test -w "$dir"; then
        echo "pgcluster: $dir is not reachable by the postgres user (a parent folder is private); choose another DIR" >&2
        exit 1
      fi
    fi
    if [ ! -f "$dir/data/PG_VERSION" ]; then
      as_owner "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
      port=${3:-$(free_port)}
      preload=
      if [ -f "$(pkglibdir)/pg_cron.so" ]; then
        preload="shared_preload_libraries = 'pg_cron'
cron.database_name = '$cron_db'
# Jobs run in background workers: no libpq connection (host, password) to configure.
cron.use_background_workers = on"
      fi
      # Settings live in postgresql.auto.conf (ALTER SYSTEM's file) so the port can be read back.
      cat >>"$dir/data/postgresql.auto.conf" <<EOF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
$preload
max_worker_processes = 32
max_connections = 200
fsync = on
log_min_messages = warning
EOF
    elif [ -n "${3:-}" ]; then
      sed -i "s/^port = .*/port = $3/" "$dir/data/postgresql.auto.conf"
    fi
    if ! as_owner "$bindir/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
      as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null \
        || { tail -n 20 "$dir/server.log" >&2; exit 1; }
    fi
    eval "$(print_env)"
    if ! psql -X -q -v ON_ERROR_STOP=1 -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$cron_db'" | grep -q 1; then
      # What docs/security.md has operators of PostgreSQL 14 run (15 made it the default):
      # pgmb's definers refuse to act while PUBLIC may create in their schema, and each
      # database's owner still may (pg_database_owner). In template1 and postgres, so that
      # every database of the cluster starts so.
      for db in template1 postgres; do
        psql -X -q -v ON_ERROR_STOP=1 -d "$db" \
          -c "ALTER SCHEMA public OWNER TO pg_database_owner" \
          -c "REVOKE CREATE ON SCHEMA public FROM PUBLIC"
      done
      psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE \"$cron_db\""
    fi
    print_env
    ;;
  restart)
    as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -m fast -w -t 60 restart >/dev/null
    ;;
  stop)
    [ -f "$dir/data/PG_VERSION" ] && as_owner "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
    ;;
  destroy)
    [ -f "$dir/data/PG_VERSION" ] && as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
    ;;
  env)
    print_env
    ;;
  *)
    echo "pgcluster: unknown command $cmd" >&2
    exit 2
    ;;
esac
