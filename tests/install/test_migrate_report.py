"""What migrate prints after applying pgmb's migration (the post_migrate receiver): the
database checks' findings with their hints, only when this run applied pgmb forwards to
pgmb's database, and not those silenced."""

from __future__ import annotations

from io import StringIO

import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from pgmb.apps import PgmbConfig
from pgmb.migrate_report import report

# A policy other than the one stored in the test database: pgmb.W040, on any server.
POLICY = {"ENDPOINT_POLICY": {"allow": [], "deny": ["192.0.2.0/24"]}}


def _printed(plan, **kwargs) -> str:
    out = StringIO()
    report(PgmbConfig, using="default", plan=plan, stdout=out, **kwargs)
    return out.getvalue()


@pytest.mark.django_db
def test_printed_after_applying_pgmb_and_only_then(settings):
    graph = MigrationLoader(connection).graph
    pgmb_initial = graph.nodes[("pgmb", "0001_initial")]
    sessions = graph.nodes[("sessions", "0001_initial")]
    settings.PGMB = POLICY

    printed = _printed([(pgmb_initial, False), (sessions, False)])
    assert "pgmb: database 'default' lacks what follows" in printed
    assert "  pgmb.W040: The in-database dispatcher's endpoint policy" in printed
    assert "\tHINT: Run 'manage.py pgmb_cron install'" in printed

    assert _printed([(sessions, False)]) == ""  # pgmb had nothing to apply
    assert _printed([(pgmb_initial, True)]) == ""  # migrating back
    assert _printed([(pgmb_initial, False)], verbosity=0) == ""
    settings.SILENCED_SYSTEM_CHECKS = ["pgmb.W040"]
    assert "pgmb.W040" not in _printed([(pgmb_initial, False)])
