#!/usr/bin/env bash
# The demo (`make demo`): a local PostgreSQL, the example project migrated, demo workers,
# queues and messages, and the admin served on http://127.0.0.1:${PORT:-8000}/admin/.
#
#   PORT=8001 scripts/demo.sh         serve on another port
#   DEMO_NO_SERVE=1 scripts/demo.sh   stop after the setup (CI, tests)
#
# The cluster lives in .pgdemo/ (ignored by git) and keeps running after the site stops;
# the script says how to stop it. Running it again reuses the cluster and the data.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
port=${PORT:-8000}
py=$repo/.venv/bin/python
manage=(env DJANGO_SETTINGS_MODULE=example.settings "$py" "$repo/example_project/manage.py")
say() { printf '\033[1mdemo:\033[0m %s\n' "$*"; }

if [ ! -x "$py" ]; then
  echo "demo: no virtualenv in .venv; run 'make demo' (it installs what the demo needs)" >&2
  exit 1
fi
# Checked before anything registers this port as the demo workers' endpoint.
if [ -z "${DEMO_NO_SERVE:-}" ] && ! "$py" -c 'import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))' "$port" 2>/dev/null; then
  echo "demo: port $port is in use; choose another one: PORT=8001 make demo" >&2
  exit 1
fi

# pg_cron runs in one database, named when the cluster starts: make it the demo's.
export PGMB_CRON_DB=pgmb_demo
dir=.pgdemo
fallback=/var/tmp/pgmb-demo-$(printf %s "$repo" | sha1sum | cut -c1-8)
if [ "$(id -u)" = 0 ] && [ ! -d "$dir/data" ] && ! runuser -u postgres -- test -x "$repo"; then
  # As root the server runs as "postgres", which cannot enter a private checkout.
  say "the postgres user cannot reach $repo; the cluster goes to $fallback instead"
  dir=$fallback
elif [ ! -d "$dir/data" ] && [ -d "$fallback/data" ]; then
  dir=$fallback  # an earlier run had to fall back: keep using its data
fi
if ! out=$(scripts/pgcluster.sh start "$dir" 2>&1); then
  if [ "$dir" != "$fallback" ] && grep -q "not reachable by the postgres user" <<<"$out"; then
    say "the postgres user cannot reach $repo/$dir; the cluster goes to $fallback instead"
    dir=$fallback
    out=$(scripts/pgcluster.sh start "$dir")
  else
    echo "$out" >&2
    exit 1
  fi
fi
eval "$(grep '^export PG' <<<"$out")"
export PGDATABASE=pgmb_demo
say "PostgreSQL is up in $dir (127.0.0.1:$PGPORT, database $PGDATABASE)"

psql -X -q -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'pgmb_demo'" | grep -q 1 \
  || psql -X -q -v ON_ERROR_STOP=1 -d postgres -c 'CREATE DATABASE pgmb_demo'
cron_db=$(psql -X -q -d postgres -tAc "SELECT current_setting('cron.database_name', true)")
if [ "$cron_db" != pgmb_demo ]; then
  say "note: this cluster's pg_cron runs in database '$cron_db', not pgmb_demo (it was created"
  say "      by an earlier setup); 'scripts/pgcluster.sh destroy $dir' and run the demo again to fix"
fi

"${manage[@]}" migrate --noinput
"${manage[@]}" shell -v 0 -c '
from django.contrib.auth import get_user_model
User = get_user_model()
if not User.objects.filter(username="admin").exists():
    User.objects.create_superuser("admin", "admin@example.com", "admin")
    print("superuser admin created")
'
"${manage[@]}" demo_setup --port "$port"

cat <<EOF

  admin:    http://127.0.0.1:$port/admin/   (user admin, password admin)
  psql:     PGHOST=$PGHOST PGPORT=$PGPORT PGUSER=$PGUSER PGDATABASE=$PGDATABASE psql
            e.g. SELECT * FROM pgmb.order_queue WHERE acknoledge = false;
  manage:   PGPORT=$PGPORT PGDATABASE=$PGDATABASE python example_project/manage.py ...
  stop the database: scripts/pgcluster.sh stop $dir
  remove it:         scripts/pgcluster.sh destroy $dir

EOF

if [ -n "${DEMO_NO_SERVE:-}" ]; then
  say "DEMO_NO_SERVE is set: not starting the site"
  exit 0
fi

# The external dispatcher delivers while the site runs (the example site is the worker).
"${manage[@]}" pgmb_dispatch &
dispatcher=$!
say "dispatcher started (pid $dispatcher): messages are POSTed to /worker/orders/ and /worker/flaky/"
say "the in-database dispatcher (pg_cron) is the other way: python example_project/manage.py pgmb_cron install"
trap 'kill "$dispatcher" 2>/dev/null; say "site stopped; the database keeps running (scripts/pgcluster.sh stop $dir)"' EXIT

say "serving http://127.0.0.1:$port/admin/ (Ctrl-C stops the site)"
"${manage[@]}" runserver --noreload "127.0.0.1:$port"
