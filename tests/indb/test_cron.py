"""pg_cron scheduling of the in-database dispatcher, and manage.py pgmb_cron."""

import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import pgmb
from pgmb import dispatcher_registry
from pgmb.models import Delivery
from tests.waiting import wait_until


@pytest.fixture
def cron(needs_pg_cron, pg):
    """pg_cron installed in the test database for this test only; jobs and runs removed after."""
    pg.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
    yield pg
    pg.execute("SELECT pgmb.cron_uninstall()")
    # A loop a job started sees its job gone and ends within one iteration.
    _wait_until_no_loop(pg)
    pg.execute("DROP EXTENSION pg_cron")


def _wait_until_no_loop(pg) -> None:
    def no_loop() -> bool:
        [(loops,)] = pg.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE query LIKE 'CALL pgmb.dispatch_loop%%' AND pid <> pg_backend_pid()"
        ).fetchall()
        return loops == 0

    wait_until(no_loop, message="the dispatch loop to end with its pg_cron job")


def _dispatch_job(pg_cron_version: str) -> tuple[str, str]:
    """The schedule and command of pgmb-dispatch: pg_cron 1.5 added schedules in seconds,
    which pgmb uses to start a short loop every second; before, a loop of 55 s each minute."""
    major, minor = re.match(r"(\d+)\.(\d+)", pg_cron_version).groups()  # e.g. "1.4-1"
    if (int(major), int(minor)) >= (1, 5):
        return "1 seconds", "CALL pgmb.dispatch_loop(0.9, 50, as_job => true)"
    return "* * * * *", "CALL pgmb.dispatch_loop(55, 50, as_job => true)"


def test_install_status_uninstall(cron):
    [(version,)] = cron.execute(
        "SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'"
    ).fetchall()
    schedule, command = _dispatch_job(version)
    out = StringIO()
    call_command("pgmb_cron", "install", stdout=out)
    assert f"pgmb-dispatch: {schedule}  {command}" in out.getvalue()
    jobs = dict(cron.execute("SELECT jobname, schedule FROM cron.job").fetchall())
    assert jobs == {"pgmb-dispatch": schedule, "pgmb-maintenance": "* * * * *"}
    out = StringIO()
    call_command("pgmb_cron", "status", stdout=out)
    status = out.getvalue()
    assert f"pg_cron version here: {version}" in status
    assert "HTTP transport: plpython3u" in status or "HTTP transport: http" in status
    assert f"pgmb-dispatch [{schedule}] active" in status
    call_command("pgmb_cron", "install", stdout=StringIO())  # again: same two jobs
    assert cron.execute("SELECT count(*) FROM cron.job").fetchone() == (2,)
    out = StringIO()
    call_command("pgmb_cron", "uninstall", stdout=out)
    assert "unscheduled 2 job(s)" in out.getvalue()
    assert cron.execute("SELECT count(*) FROM cron.job").fetchone() == (0,)


def test_pg_cron_runs_the_dispatcher(cron, recording_server, make_worker, make_queue):
    """A real pg_cron run (pg_cron before 1.5 schedules by the minute: this waits up to ~65 s)."""
    make_queue("#", worker=make_worker(endpoint=recording_server.url("/cron")))
    ids = pgmb.send_batch(("k", n) for n in range(5))
    cron.execute("SELECT pgmb.cron_install()")
    recording_server.wait_for(5, timeout=150)  # the next minute (or second), and then some
    wait_until(lambda: not Delivery.objects.exists(), message="the 5 deliveries to be acked")
    assert {r.headers["pgmb-message-id"] for r in recording_server.requests} == set(map(str, ids))
    assert not Delivery.objects.exists()
    runs = cron.execute(
        "SELECT count(*) FROM cron.job_run_details r JOIN cron.job j USING (jobid) "
        "WHERE j.jobname = 'pgmb-dispatch'"
    ).fetchone()[0]
    assert runs >= 1
    [(loops,)] = cron.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CALL pgmb.dispatch_loop%%'"
    ).fetchall()
    assert loops == 1  # the job's loop is visible (the fixture then checks it stops)
    # ...and registered as a dispatcher, running.
    wait_until(
        lambda: any(
            d.kind == "in_database" and d.state == "running"
            for d in dispatcher_registry.dispatchers()
        ),
        message="the job's loop to show as a running dispatcher",
    )


def test_maintenance_reclaims_and_trims(cron, make_queue):
    make_queue("#", lease_seconds=60)
    pgmb.send("k", 1)
    cron.execute("SELECT count(*) FROM pgmb.claim(NULL, 1)")
    cron.execute("UPDATE pgmb_delivery SET available_at = now() - interval '1 second'")
    assert cron.execute("SELECT pgmb.maintenance()").fetchone() == (1,)
    assert Delivery.objects.get().state == "ready"


def test_install_without_pg_cron_in_the_database_explains(pg, settings):
    # pg_cron is preloaded for this database, so install creates the extension; to see the
    # error path, ask the SQL function directly with the extension absent.
    pg.execute("DROP EXTENSION IF EXISTS pg_cron")
    with pytest.raises(Exception, match="pg_cron is not installed in this database"):
        pg.execute("SELECT pgmb.cron_install()")
    with pytest.raises(CommandError, match="invalid choice"):
        call_command("pgmb_cron", "reinstall")
