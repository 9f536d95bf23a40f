#!/usr/bin/env bash
# Run a command against a throwaway PostgreSQL cluster, then stop and delete the cluster.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d "${TMPDIR:-/tmp}/pgmb-cluster.XXXXXX")
chmod 755 "$dir"
trap '"$here/pgcluster.sh" destroy "$dir"' EXIT
eval "$("$here/pgcluster.sh" start "$dir")"
export PGMB_CLUSTER_DIR=$dir
"$@"
