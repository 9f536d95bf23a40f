"""The PL/Python transport where the database's owner is not a superuser (a managed
service's): functions in plpython3u, an untrusted language, are a superuser's to create.
Migrating succeeds whether a DBA created the language beforehand or not; what it skipped is
said by migrate's report and by check (pgmb.W004), and the DBA's following the hint, as the
superuser the hint names, loads the transport (``pgmb_cron install``, idempotent); an older
transport the owner may not replace is reported too (pgmb.W007)."""

from __future__ import annotations

import re

import psycopg
import pytest

from pgmb import sql

LOAD = "then, as that superuser, 'manage.py pgmb_cron install' connecting as itself"
POST = "SELECT status FROM pgmb.post(%s, '{\"a\": 1}', '{}', 5)"


def _said(result) -> str:
    return result.stdout + result.stderr


def _hint(text: str, check_id: str) -> str:
    found = re.search(rf"{check_id}: .*\n\tHINT: (.*)|\({check_id}\).*\n\tHINT: (.*)", text)
    assert found, f"no {check_id} in:\n{text}"
    return found.group(1) or found.group(2)


def _transport(owned) -> str | None:
    with owned.connect() as conn:
        return conn.execute("SELECT pgmb.http_transport()").fetchone()[0]


@pytest.fixture
def superuser_name(superuser) -> str:
    return superuser.info.user


@pytest.mark.parametrize("language", ["absent", "created by a DBA beforehand"])
def test_the_owner_migrates_and_a_superuser_loads_the_transport(
    needs_plpython, owned_database, superuser_name, recording_server, language
):
    owned = owned_database()
    if language != "absent":
        with owned.as_superuser() as dba:
            dba.execute("CREATE EXTENSION plpython3u")

    # Both migrations (0.1.0's and 0.1.1's PL/Python steps) go on as the owner.
    migrated = owned.manage("migrate", "--noinput")
    assert "Applying pgmb.0002_release_0_1_1... OK" in migrated.stdout
    assert _transport(owned) is None
    hint = _hint(migrated.stdout, "pgmb.W004")
    assert "CREATE EXTENSION IF NOT EXISTS plpython3u; " + LOAD in hint
    assert f"Then, as {owned.owner}, run 'manage.py pgmb_cron install'" in hint
    checked = _said(owned.manage("check", "--database", "default"))
    assert _hint(checked, "pgmb.W004") == hint
    if language != "absent":
        assert f"role '{owned.owner}' may not create functions in it" in checked
    status = owned.manage("pgmb_cron", "status").stdout
    assert f"PL/Python transport: not loaded (role {owned.owner} may not load it" in status

    # The DBA's first statement, then the owner's pgmb_cron install: not refused for the
    # language (pg_cron, which does not serve this database, is what it stops at).
    with owned.as_superuser() as dba:
        dba.execute(hint.split(": ", 1)[1].split(" then,", 1)[0])
    installed = owned.manage("pgmb_cron", "install", ok=False)
    assert "permission denied for language" not in _said(installed)
    assert LOAD in installed.stderr
    assert _transport(owned) is None

    # The rest of the hint, as the superuser it names; twice: the second has nothing to do.
    loaded = owned.manage("pgmb_cron", "install", user=superuser_name)
    assert "loaded the PL/Python transport" in loaded.stdout
    assert f"as {owned.owner}, pgmb's owner, run 'manage.py pgmb_cron install'" in loaded.stdout
    again = owned.manage("pgmb_cron", "install", user=superuser_name)
    assert "loaded" not in again.stdout
    assert _transport(owned) == "plpython3u"
    checked = _said(owned.manage("check", "--database", "default"))
    assert "pgmb.W004" not in checked and "pgmb.W007" not in checked
    status = owned.manage("pgmb_cron", "status").stdout
    assert "PL/Python transport: this version's\n" in status

    # The owner posts through it; a role with no grant may not.
    with owned.connect() as conn:
        assert conn.execute(POST, (recording_server.url("/hook"),)).fetchone() == (200,)
    [request] = recording_server.wait_for(1)
    assert request.json() == {"a": 1}
    with (
        owned.connect(owned.login_role()) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute(POST, (recording_server.url("/hook"),))

    # Migrating pgmb back and forth as the owner leaves the superuser's transport alone.
    owned.manage("migrate", "pgmb", "0001", "--noinput")
    owned.manage("migrate", "--noinput")
    assert _transport(owned) == "plpython3u"


def test_an_older_transport_the_owner_may_not_replace_is_reported(
    needs_plpython, owned_database, superuser_name
):
    owned = owned_database()
    with owned.as_superuser() as dba:
        dba.execute("CREATE EXTENSION plpython3u")
    owned.manage("migrate", "--noinput")
    owned.manage("pgmb_cron", "install", user=superuser_name)
    # Another version's transport: one body differs from this version's.
    older = sql.schema_source(sql.PLPYTHON).replace("$py$\n", "$py$\n# another version\n", 1)
    with owned.as_superuser() as dba:
        dba.execute(older)

    checked = _said(owned.manage("check", "--database", "default"))
    assert f"role '{owned.owner}' may not replace it" in checked
    hint = _hint(checked, "pgmb.W007")
    assert hint.startswith(f"A DBA (a superuser) runs in database '{owned.name}' 'manage.py")
    assert "permission denied for language" not in _said(
        owned.manage("pgmb_cron", "install", ok=False)
    )

    loaded = owned.manage("pgmb_cron", "install", user=superuser_name)
    assert "loaded the PL/Python transport" in loaded.stdout
    assert "pgmb.W007" not in _said(owned.manage("check", "--database", "default"))
