"""The in-database loop's constants have one home each: a Python value, and an IMMUTABLE SQL
function pgmb.dispatch_loop names instead of a literal (pgmb/sql/schema/indb.sql). One table of
cases compares each pair, and the loop's source holds none of the values as a literal."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from pgmb import indb
from pgmb.conf import Settings
from pgmb.dispatch.pacing import UNPACED_RPS

pytestmark = pytest.mark.django_db

# (SQL expression giving the value, the Python value it must equal)
CONSTANTS = [
    ("pgmb.unpaced_rps()", UNPACED_RPS),
    ("extract(epoch FROM pgmb.indb_heartbeat_interval())", Settings.DISPATCH_HEARTBEAT_INTERVAL),
    ("extract(epoch FROM pgmb.indb_reclaim_interval())", Settings.DISPATCH_RECLAIM_INTERVAL),
    ("pgmb.indb_batch()", indb.DEFAULT_BATCH),
]


def scalar(statement: str) -> object:
    with connection.cursor() as cursor:
        cursor.execute(statement)
        return cursor.fetchone()[0]


@pytest.mark.parametrize(("expression", "python_value"), CONSTANTS)
def test_the_sql_constant_is_the_python_one(expression, python_value):
    assert float(scalar(f"SELECT {expression}")) == float(python_value)


@pytest.mark.parametrize(
    "signature",
    ["pgmb.dispatch_loop(float8, integer, text[], boolean)", "pgmb.cron_install(integer)"],
)
def test_the_batch_defaults_are_the_named_constant(signature):
    arguments = scalar(f"SELECT pg_get_function_arguments('{signature}'::regprocedure)")
    assert "batch integer DEFAULT pgmb.indb_batch()" in str(arguments)


def test_the_loop_spells_no_threshold_or_interval():
    source = scalar(
        "SELECT string_agg(pg_get_functiondef(p.oid), E'\\n') FROM pg_proc AS p"
        " WHERE p.pronamespace = 'pgmb'::regnamespace"
        " AND (p.proname = 'dispatch_loop' OR p.proname LIKE 'loop\\_%')"
    )
    assert isinstance(source, str) and "CREATE OR REPLACE PROCEDURE pgmb.dispatch_loop" in source
    assert not re.search(r"\b1000\b", source.replace("* 1000", "")), "rps threshold spelt out"
    assert "interval '5 seconds'" not in source
