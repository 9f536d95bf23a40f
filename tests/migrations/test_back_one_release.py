"""Migrating back from the unreleased migration to the previous release gives that
release's schema again, object for object (its .down.sql puts back what it changed)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.migrations.conftest import manage
from tests.migrations.releases import RELEASED, UNRELEASED

FINGERPRINT = (Path(__file__).parent / "fingerprint.sql").read_text()


@pytest.mark.django_db
def test_migrating_back_gives_the_previous_release_schema(scratch):
    with scratch("pgmb_back_one_release") as info:
        manage(info["dbname"], "migrate", "pgmb", RELEASED[-1], "--noinput", "-v", "0")
        with psycopg.connect(**info, autocommit=True) as conn:
            released = conn.execute(FINGERPRINT).fetchall()
        manage(info["dbname"], "migrate", "pgmb", UNRELEASED, "--noinput", "-v", "0")
        manage(info["dbname"], "migrate", "pgmb", RELEASED[-1], "--noinput", "-v", "0")
        with psycopg.connect(**info, autocommit=True) as conn:
            back = conn.execute(FINGERPRINT).fetchall()
    missing = sorted(set(released) - set(back))
    extra = sorted(set(back) - set(released))
    assert (missing, extra) == ([], [])
