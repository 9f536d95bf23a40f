"""manage.py pgmb_housekeeping: rebuilds pgmb_delivery's indexes left large by a backlog."""

from __future__ import annotations

import io

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from pgmb.db.conninfo import conninfo_from_django
from tests.indexes import SMALL, drained_backlog, index_sizes

THRESHOLDS = {"HOUSEKEEPING_MIN_INDEX_BYTES": SMALL.min_index_bytes}


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("pgmb_housekeeping", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@override_settings(PGMB=THRESHOLDS)
def test_it_rebuilds_the_large_indexes_and_says_so(transactional_db, make_queue):
    make_queue("order.#")
    before = drained_backlog()

    dry = run("--dry-run")
    assert "would reindex pgmb_delivery_pkey" in dry
    assert index_sizes() == before

    out = run()
    assert out.startswith("pgmb_delivery: 0 live rows")
    assert "reindexed pgmb_delivery_pkey" in out and "reindexed pgmb_delivery_due" in out
    assert index_sizes()["pgmb_delivery_pkey"] < SMALL.min_index_bytes
    assert "no index to rebuild" in run()  # once done, nothing more to do


def test_with_the_default_thresholds_a_small_table_is_left_alone(transactional_db):
    before = index_sizes()
    assert run().splitlines()[-1] == "no index to rebuild"
    assert index_sizes() == before


@override_settings(PGMB=THRESHOLDS)
def test_a_failure_is_an_error_exit(transactional_db, make_queue):
    make_queue("order.#")
    drained_backlog()
    with psycopg.connect(**conninfo_from_django("default")) as blocker:
        blocker.execute("LOCK TABLE pgmb_delivery IN SHARE UPDATE EXCLUSIVE MODE")
        with pytest.raises(CommandError, match=r"1 step\(s\) failed"):
            run()


def test_another_process_at_it_is_not_an_error(transactional_db):
    with psycopg.connect(**conninfo_from_django("default"), autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(hashtextextended('pgmb housekeeping', 0))")
        assert run() == "another process is doing housekeeping: nothing done\n"


def test_an_unknown_database_is_refused(transactional_db):
    with pytest.raises(CommandError, match=r"'nope' is not in settings\.DATABASES"):
        run("--database", "nope")
