#!/usr/bin/env bash
# Install the Debian packages named as arguments that are not installed yet (as root), or
# say which are missing (as anyone else).
set -euo pipefail
missing=()
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then
  echo "installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian starts a cluster, nginx and pgbouncer on install; ours are private (the tests
  # start their own pgbouncer on a free port), the system's are not needed.
  if command -v service >/dev/null; then
    service postgresql stop >/dev/null 2>&1 || true
    service nginx stop >/dev/null 2>&1 || true
    service pgbouncer stop >/dev/null 2>&1 || true
  fi
else
  echo "missing Debian packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
