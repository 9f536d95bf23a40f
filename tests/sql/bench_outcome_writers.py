"""What cancel and run now cost the outcome writers: pgmb.ack and pgmb.settle_failures
(through pgmb.fail) as of a commit (BEFORE_COMMIT, git) against this tree's, on ordinary
rows, one delivery a call, in ABBA rounds; measured as the backend's CPU time
(/proc/PID/schedstat), which other people's work on a shared machine moves less than a
clock does. A pytest module (its name is not collected: run it by path), on a throwaway cluster:

    BEFORE_COMMIT=8e6f210 scripts/with-cluster.sh env PYTHONPATH=$PWD \
        DJANGO_SETTINGS_MODULE=tests.settings .venv/bin/python -m pytest -q -s \
        tests/sql/bench_outcome_writers.py
"""

import os
import re
import statistics
import subprocess
from pathlib import Path

from django.db import connection

import pgmb
from pgmb import deliveries

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = "pgmb/sql/schema/deliveries.sql"


def funcs(text, names):
    """The CREATE OR REPLACE FUNCTION statements of ``names`` in ``text``."""
    found = []
    for name in names:
        start = re.search(rf"^CREATE OR REPLACE FUNCTION {re.escape(name)}\(", text, re.M).start()
        found.append(text[start : text.index("END $$;", start) + len("END $$;")])
    return "\n".join(found)


def _schema_at(commit):
    return subprocess.run(
        ["git", "show", f"{commit}:{SCHEMA}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


BEFORE = funcs(
    _schema_at(os.environ.get("BEFORE_COMMIT", "8e6f210")), ["pgmb.ack", "pgmb.settle_failures"]
)
AFTER = funcs((ROOT / SCHEMA).read_text(), ["pgmb.ack", "pgmb.settle_failures"])
N = 1500
LOOPS = """
CREATE OR REPLACE FUNCTION pg_temp.acks(ids bigint[]) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE t timestamptz := clock_timestamp(); i bigint;
BEGIN
    FOREACH i IN ARRAY ids LOOP
        PERFORM pgmb.ack(ARRAY[i], ARRAY[200], ARRAY[1.0::float8]);
    END LOOP;
    RETURN extract(epoch FROM clock_timestamp() - t);
END $$;
CREATE OR REPLACE FUNCTION pg_temp.fails(ids bigint[], leases uuid[]) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE t timestamptz := clock_timestamp(); i integer;
BEGIN
    FOR i IN 1 .. cardinality(ids) LOOP
        PERFORM pgmb.fail(ARRAY[ids[i]], ARRAY[leases[i]], ARRAY[500], ARRAY['down'], NULL,
                          ARRAY[1.0::float8]);
    END LOOP;
    RETURN extract(epoch FROM clock_timestamp() - t);
END $$;
"""


def cpu_ns(pid):
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def phase(cur, sql_text):
    cur.execute("SELECT pg_backend_pid()")
    pid = cur.fetchone()[0]
    cur.execute(sql_text)
    out = {}
    pgmb.send_batch(("k", n) for n in range(N))
    claims = deliveries.claim(None, N)
    c0 = cpu_ns(pid)
    cur.execute("SELECT pg_temp.acks(%s::bigint[])", ([c.delivery_id for c in claims],))
    out["ack, one delivery a call"] = (cpu_ns(pid) - c0) / N / 1e3
    pgmb.send_batch(("k", n) for n in range(N))
    claims = deliveries.claim(None, N)
    c0 = cpu_ns(pid)
    cur.execute(
        "SELECT pg_temp.fails(%s::bigint[], %s::uuid[])",
        ([c.delivery_id for c in claims], [c.lease_id for c in claims]),
    )
    out["fail (settle_failures), one delivery a call"] = (cpu_ns(pid) - c0) / N / 1e3
    cur.execute("DELETE FROM pgmb_delivery")
    return out


def test_outcome_writers_abba(make_queue, make_worker):
    make_queue("#", name="bench", worker=make_worker(rps=1_000_000, burst=1.0), max_retries=5)
    with connection.cursor() as cur:
        cur.execute(LOOPS)
        phase(cur, BEFORE)
        phase(cur, AFTER)
        ratios = {}
        for _round in range(6):
            a1 = phase(cur, BEFORE)
            b1 = phase(cur, AFTER)
            b2 = phase(cur, AFTER)
            a2 = phase(cur, BEFORE)
            for k in a1:
                ratios.setdefault(k, []).append(((b1[k] + b2[k]) / 2) / ((a1[k] + a2[k]) / 2))
                ratios.setdefault(k + " (before µs)", []).append((a1[k] + a2[k]) / 2)
                ratios.setdefault(k + " (after µs)", []).append((b1[k] + b2[k]) / 2)
    for k, v in ratios.items():
        print(f"{k}: median {statistics.median(v):.3f}  rounds {' '.join(f'{x:.3f}' for x in v)}")
