"""pgmb without Django (pgmb/extension.py): the extension's files written from the release
migrations, installed into the server's extension folder (and taken out after, as found:
decision 0049), ``CREATE EXTENSION pgmb`` in a database Django never touched, the original
pgmb README's SQL run there as written, pg_cron delivering through it in a cluster of its
own, ``ALTER EXTENSION pgmb UPDATE`` from the first release, and a Django project adopting
the database (``manage.py pgmb_adopt_extension``) to the schema ``migrate`` builds."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from pgmb import extension
from tests.migrations.conftest import ROOT, manage
from tests.migrations.test_schema import _fingerprint
from tests.sql.test_seed_api import CREATE_QUICK_START, MONITORING, PLACEHOLDER, REGISTER, SENDS
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def installed(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[dict[str, str]]:
    """The extension's files in the server's extension folder for the module's tests."""
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("SELECT setting FROM pg_config WHERE name = 'SHAREDIR'")
        folder = Path(cursor.fetchone()[0]) / "extension"
        written = extension.write(tmp_path_factory.mktemp("extension"))
    if not os.access(folder, os.W_OK):
        pytest.skip(f"{folder} is not writable here (make test runs as root in CI)")
    names = [path.name for path in written]
    clashes = [name for name in names if (folder / name).exists()]
    assert clashes == [], f"pgmb's extension files are in {folder} already: {clashes}"
    for path in written:
        shutil.copyfile(path, folder / path.name)
    try:
        yield {path.name: path.read_text() for path in written}
    finally:
        for name in names:
            (folder / name).unlink(missing_ok=True)


def test_the_files_are_the_release_migrations(installed):
    versions = [r.version for r in extension.releases()]
    assert versions[:3] == ["0.1.0", "0.1.1", "0.2.0"]
    newest = versions[-1]
    assert set(installed) == {
        "pgmb.control",
        f"pgmb--{versions[0]}.sql",
        f"pgmb--{newest}.sql",
        *(f"pgmb--{a}--{b}.sql" for a, b in itertools.pairwise(versions)),
    }
    assert f"default_version = '{newest}'" in installed["pgmb.control"]
    # The install script is every release's in turn; an update script, its release's.
    runs = re.compile(r"^-- Run pgmb/sql/migrations/\S+\.sql$", re.MULTILINE)
    assert len(runs.findall(installed[f"pgmb--{newest}.sql"])) == len(versions)
    assert len(runs.findall(installed[f"pgmb--{versions[-2]}--{newest}.sql"])) == 1


def test_create_extension_then_the_original_readme_as_written(installed, scratch):
    with (
        scratch(f"pgmb_ext_{uuid.uuid4().hex[:8]}") as info,
        psycopg.connect(**info, autocommit=True) as conn,
    ):
        conn.execute("CREATE EXTENSION pgmb")
        [(worker_id,)] = conn.execute(REGISTER).fetchall()
        conn.execute(CREATE_QUICK_START.replace(PLACEHOLDER, str(worker_id)))
        ids = [conn.execute(snippet).fetchone()[0] for snippet in SENDS]
        assert len(set(ids)) == 5
        for snippet in MONITORING:
            conn.execute(snippet)
        [(pending,)] = conn.execute(MONITORING[2]).fetchall()
        assert pending == 5
        [(due,)] = conn.execute(
            "SELECT count(*) FROM pgmb_delivery WHERE available_at <= now()"
        ).fetchall()
        assert due == 3
        # Nothing of Django's is there: no migrations table, no auth.
        [(django,)] = conn.execute(
            "SELECT count(*) FROM pg_class"
            " WHERE relname LIKE 'django\\_%' OR relname LIKE 'auth\\_%'"
        ).fetchall()
        assert django == 0


def test_update_from_the_first_release_gives_the_same_schema(installed, scratch):
    with (
        scratch(f"pgmb_ext_{uuid.uuid4().hex[:8]}") as whole,
        scratch(f"pgmb_ext_{uuid.uuid4().hex[:8]}") as updated,
    ):
        with psycopg.connect(**whole, autocommit=True) as conn, conn.cursor() as cursor:
            conn.execute("CREATE EXTENSION pgmb")
            expected = _fingerprint(cursor)
        with psycopg.connect(**updated, autocommit=True) as conn, conn.cursor() as cursor:
            first = extension.releases()[0].version
            conn.execute(f"CREATE EXTENSION pgmb VERSION '{first}'")
            conn.execute("ALTER EXTENSION pgmb UPDATE")
            [(version,)] = conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'pgmb'"
            ).fetchall()
            assert version == extension.releases()[-1].version
            assert _fingerprint(cursor) == expected


@pytest.mark.django_db
def test_a_django_project_adopts_the_database(installed, scratch):
    with connection.cursor() as cursor:
        migrated = _fingerprint(cursor)
        cursor.execute("SELECT count(*) FROM pg_language WHERE lanname = 'plpython3u'")
        [(plpython,)] = cursor.fetchall()
    with scratch(f"pgmb_ext_{uuid.uuid4().hex[:8]}") as info:
        with psycopg.connect(**info, autocommit=True) as conn:
            if plpython:  # as in the test database, for the same schema
                conn.execute("CREATE EXTENSION plpython3u")
            conn.execute("CREATE EXTENSION pgmb")
            conn.execute("SELECT pgmb.send(gen_random_uuid(), 'before.adoption', '{}'::jsonb)")
        adopted = manage(info["dbname"], "pgmb_adopt_extension")
        assert "adopted pgmb" in adopted.stdout
        manage(info["dbname"], "migrate", "--no-input")
        manage(info["dbname"], "migrate", "--check")
        with psycopg.connect(**info, autocommit=True) as conn, conn.cursor() as cursor:
            assert conn.execute(
                "SELECT count(*) FROM pg_extension WHERE extname = 'pgmb'"
            ).fetchone() == (0,)
            assert conn.execute("SELECT routing_key FROM pgmb_message").fetchall() == [
                ("before.adoption",)
            ]
            assert _fingerprint(cursor) == migrated
        assert "not installed in this database: nothing to adopt" in _refusal(info["dbname"])


def _refusal(dbname: str) -> str:
    """What pgmb_adopt_extension says when it refuses (it must)."""
    env = {**os.environ, "PGMB_DB_NAME": dbname, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "django", "pgmb_adopt_extension"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0, done.stdout
    return done.stderr


def test_adoption_refuses_what_it_cannot_take_and_changes_nothing(installed, scratch):
    with scratch(f"pgmb_ext_{uuid.uuid4().hex[:8]}") as info:
        with psycopg.connect(**info, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pgmb")
            conn.execute(
                "CREATE TABLE django_migrations (id bigserial PRIMARY KEY, app varchar(255),"
                " name varchar(255), applied timestamptz)"
            )
            conn.execute(
                "INSERT INTO django_migrations (app, name, applied)"
                " VALUES ('pgmb', '0001_initial', now())"
            )
        assert "migrations of pgmb are recorded here already" in _refusal(info["dbname"])
        with psycopg.connect(**info, autocommit=True) as conn:
            conn.execute("DELETE FROM django_migrations")
            conn.execute("SET allow_system_table_mods = on")
            conn.execute("UPDATE pg_extension SET extversion = '0.0.9' WHERE extname = 'pgmb'")
        refused = _refusal(info["dbname"])
        assert "extension pgmb 0.0.9 is not a release this pgmb knows" in refused
        with psycopg.connect(**info, autocommit=True) as conn:
            [(members,)] = conn.execute(
                "SELECT count(*) FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid"
                " WHERE e.extname = 'pgmb' AND d.deptype = 'e'"
            ).fetchall()
            assert members > 100  # still the extension's, all of it
            assert conn.execute("SELECT count(*) FROM django_migrations").fetchone() == (0,)


def test_pg_cron_delivers_through_the_extension(installed, make_recording_server):
    """A cluster of its own, whose pg_cron runs in the database that has the extension (a
    cluster's pg_cron serves one database: cron.database_name)."""
    server = make_recording_server()
    folder = tempfile.mkdtemp(prefix="pgmb-extension-")
    script = str(ROOT / "scripts" / "pgcluster.sh")
    env = {**os.environ, "PGMB_CRON_DB": "pgmb_sql_only"}
    try:
        started = subprocess.run(
            [script, "start", folder], env=env, capture_output=True, text=True, timeout=120
        )
        assert started.returncode == 0, started.stderr
        port = re.search(r"PGPORT=(\d+)", started.stdout).group(1)
        info = {"host": "127.0.0.1", "port": port, "user": "postgres", "dbname": "pgmb_sql_only"}
        with psycopg.connect(**info, autocommit=True) as conn:
            available = {
                name for (name,) in conn.execute("SELECT name FROM pg_available_extensions")
            }
            if not {"pg_cron", "plpython3u"} <= available:
                pytest.skip("pg_cron or plpython3u is not installed with this server")
            for name in ("pg_cron", "plpython3u", "pgmb"):
                conn.execute(f"CREATE EXTENSION {name}")
            [(worker_id,)] = conn.execute(
                "SELECT pgmb.worker('order_processor', %s, 100)", [server.url("/process")]
            ).fetchall()
            conn.execute(CREATE_QUICK_START.replace(PLACEHOLDER, str(worker_id)))
            [(message_id,)] = conn.execute(SENDS[0]).fetchall()
            conn.execute("SELECT pgmb.cron_install()")
            server.wait_for(1, timeout=150)  # pg_cron 1.4: the next whole minute, and then some
            wait_until(
                lambda: conn.execute("SELECT count(*) FROM pgmb_delivery").fetchone() == (0,),
                message="the delivery acknowledged",
            )
            [(outcome,)] = conn.execute(
                "SELECT outcome FROM pgmb_attempt WHERE message_id = %s", [message_id]
            ).fetchall()
            assert outcome == "ack"
            conn.execute("SELECT pgmb.cron_uninstall()")
        [request] = server.requests
        assert request.path == "/process"
        assert request.json() == {"order_id": 123, "amount": 45.67}
        assert request.headers["pgmb-message-id"] == str(message_id)
    finally:
        subprocess.run([script, "destroy", folder], env=env, capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)
