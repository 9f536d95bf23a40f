#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests, benchmarks and the demo.
#
#   scripts/pgcluster.sh start DIR [PORT]   init (once) and start; prints "export PG…" lines
#   scripts/pgcluster.sh stop DIR           stop (the data stays)
#   scripts/pgcluster.sh restart DIR        restart a running cluster (fast shutdown)
#   scripts/pgcluster.sh destroy DIR        stop and delete
#   scripts/pgcluster.sh env DIR            print the "export PG…" lines of a running cluster
#
# The cluster preloads pg_cron (pointed at $PGMB_CRON_DB, default "test_pgmb", which is
# created at start so pg_cron's launcher always finds it) and listens on 127.0.0.1 and on
# a socket inside DIR. initdb refuses to run as root, so as root the server runs as the
# "postgres" system user, and DIR must be reachable by that user.
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
      # Settings live in postgresql.auto.conf (ALTER SYSTEM's file) so the port can be read back.
      cat >>"$dir/data/postgresql.auto.conf" <<EOF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
shared_preload_libraries = 'pg_cron'
cron.database_name = '$cron_db'
# Jobs run in background workers: no libpq connection (host, password) to configure.
cron.use_background_workers = on
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
    psql -X -q -v ON_ERROR_STOP=1 -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$cron_db'" | grep -q 1 \
      || psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE \"$cron_db\""
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
