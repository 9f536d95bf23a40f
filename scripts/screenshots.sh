#!/usr/bin/env bash
# Refresh the docs' screenshots: run the browser tests (tests/browser) against a
# throwaway cluster, then copy the pictures they took of the dashboard, the dead-letter
# list, a dead letter's page, a delivery's page, a queue's fair shares and a schedule's
# page into docs/images/. Arguments go to pytest, e.g. `-k dead_letters` to retake only
# those; a picture the run did not take keeps its old version.
set -euo pipefail
cd "$(dirname "$0")/.."
export PGMB_ARTIFACTS=${PGMB_ARTIFACTS:-$PWD/artifacts/screenshots}
mkdir -p "$PGMB_ARTIFACTS" docs/images
# Only this run's pictures may reach docs/images/.
find "$PGMB_ARTIFACTS" -maxdepth 1 -name '*.png' -delete
scripts/with-cluster.sh env PYTHONPATH="$PWD" DJANGO_SETTINGS_MODULE=tests.settings \
  .venv/bin/python -m pytest -q tests/browser "$@"
for name in dashboard dead-letters dead-letter-page delivery-page fair-shares schedule-page; do
  if [ -f "$PGMB_ARTIFACTS/$name.png" ]; then
    cp "$PGMB_ARTIFACTS/$name.png" "docs/images/$name.png"
    echo "docs/images/$name.png: retaken"
  else
    echo "docs/images/$name.png: not taken by this run, left as it was"
  fi
done
