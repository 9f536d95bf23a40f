"""System checks and the settings module."""

import pytest
from django.core import checks
from django.test import override_settings

from pgmb import conf
from pgmb.checks import check_server, check_settings
from pgmb.housekeeping import Thresholds


def _ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_defaults_are_typed():
    settings = conf.get()
    assert settings.DATABASE == "default"
    assert settings.SEND_BATCH_SIZE == 1000
    assert isinstance(settings.DISPATCH_GIVE_UP, float)


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        ({"SEND_BATCH_SIZE": "10"}, "must be int"),
        ({"SEND_BATCH_SIZE": 0}, "at least 1"),
        ({"DISPATCH_GIVE_UP": -1}, "must not be negative"),
        ({"DISPATCH_GIVE_UP": True}, "must be float"),
        ({"DISPATCH_HEARTBEAT_INTERVAL": 0}, "must be positive"),
        ({"DISPATCH_HEARTBEAT_INTERVAL": 21}, "at most 20 seconds"),
        ({"DISPATCH_HEARTBEAT_INTERVAL": "5"}, "must be float"),
        ({"DASHBOARD_REFRESH": -1}, "must not be negative"),
        ({"DASHBOARD_REFRESH": 2.5}, "must be int"),
        ({"DEFAULT_MAX_RETRIES": 3}, "no longer a setting: defaults of new queues"),
        ({"RATE_BURST": 0.5}, "each worker's own 'burst'"),
        ({"HOUSEKEEPING_INTERVAL": -1}, "must not be negative"),
        ({"HOUSEKEEPING_MIN_INDEX_BYTES": "8MB"}, "must be int"),
        ({"HOUSEKEEPING_BLOAT_FACTOR": 1}, "must be more than 1"),
        ({"HOUSEKEEPING_BLOAT_FACTOR": 0.5}, "must be more than 1"),
        ({"HISTORY_PREMAKE_DAYS": -1}, "must not be negative"),
        ({"HISTORY_PREMAKE_DAYS": 400}, "whole number from 0 to 366"),
        ({"HISTORY_PREMAKE_DAYS": 2.5}, "must be int"),
        ({"HISTORY_RETENTION_DAYS": -1}, "must not be negative"),
        ({"HISTORY_RETENTION_DAYS": float("nan")}, "must be a number of days, 0 or more"),
        ({"HISTORY_RETENTION_DAYS": "30"}, "must be float"),
        ({"NOPE": 1}, "not a pgmb setting"),
        ({"JSON_ENCODER": "no.such.Encoder"}, "cannot be imported"),
        ([], "must be a dict"),
    ],
)
def test_bad_settings_are_reported(raw, text):
    with override_settings(PGMB=raw):
        problems = check_settings()
        assert _ids(problems) == ["pgmb.E001"]
        assert text in problems[0].msg
        with pytest.raises(Exception, match=text):
            conf.get()


def test_history_settings_are_read():
    with override_settings(PGMB={"HISTORY_PREMAKE_DAYS": 7, "HISTORY_RETENTION_DAYS": 30}):
        assert check_settings() == []
        assert (conf.get().HISTORY_PREMAKE_DAYS, conf.get().HISTORY_RETENTION_DAYS) == (7, 30)
    assert conf.get().HISTORY_RETENTION_DAYS is None


def test_good_settings_pass_and_are_read():
    with override_settings(PGMB={"SEND_BATCH_SIZE": 50, "DISPATCH_GIVE_UP": 2}):
        assert check_settings() == []
        assert conf.get().SEND_BATCH_SIZE == 50
    assert conf.get().SEND_BATCH_SIZE == 1000


def test_housekeeping_settings_are_read_into_its_thresholds():
    assert Thresholds.from_settings() == Thresholds()  # the defaults are the module's
    raw = {
        "HOUSEKEEPING_INTERVAL": 0,
        "HOUSEKEEPING_MIN_INDEX_BYTES": 1024,
        "HOUSEKEEPING_BLOAT_FACTOR": 2.5,
    }
    with override_settings(PGMB=raw):
        assert check_settings() == []
        assert conf.get().HOUSEKEEPING_INTERVAL == 0
        assert Thresholds.from_settings() == Thresholds(1024, 2.5)


def test_unknown_database_alias():
    with override_settings(PGMB={"DATABASE": "other"}):
        assert _ids(check_settings()) == ["pgmb.E003"]


@pytest.mark.django_db
def test_server_check_passes_on_postgres_15():
    assert check_server(databases=["default"]) == []
    found = checks.run_checks(databases=["default"], include_deployment_checks=False)
    assert [m for m in found if m.level >= checks.ERROR] == []


@pytest.mark.django_db
def test_in_database_dispatch_checks_say_what_is_missing(sql, needs_pg_cron, needs_plpython):
    from pgmb.checks import check_in_database_dispatch

    assert check_in_database_dispatch() == []  # only with --database
    found = {m.id: m for m in check_in_database_dispatch(databases=["default"])}
    [(offered, installed)] = sql(
        "SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'pg_cron'),"
        " EXISTS (SELECT FROM pg_extension WHERE extname = 'pg_cron')"
    )
    if not offered:  # the PostgreSQL 18 of the matrix
        assert "not available on this server" in found["pgmb.W001"].msg
        assert "pgmb_dispatch" in found["pgmb.W001"].hint
    elif not installed:  # the Debian cluster preloads it for the test database
        assert "pgmb.W003" in found
        assert "pgmb_cron install" in found["pgmb.W003"].hint
    [(transport,)] = sql("SELECT pgmb.http_transport()")
    if transport == "plpython3u":  # the Debian cluster has PL/Python
        assert "pgmb.W004" not in found
        sql("DROP FUNCTION pgmb.post_via_plpython(text, text, jsonb, float8)")
        found = {m.id: m for m in check_in_database_dispatch(databases=["default"])}
    assert "PL/Python" in found["pgmb.W004"].hint
    assert "pgmb_dispatch" in found["pgmb.W004"].hint
