"""Fixtures shared by every layer of tests.

The database is a real PostgreSQL started by ``scripts/with-cluster.sh``: Debian's, with
pg_cron preloaded and plpython3u, or for the core layers another major of ``make test``'s
matrix, whose build has neither (``needs_pg_cron`` and ``needs_plpython`` skip, saying so).
Its test database is kept between runs (``--reuse-db``) because pg_cron holds a connection
to it.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from django.db import connection, connections, transaction

from pgmb import indb
from pgmb.db.conninfo import conninfo_from_django
from pgmb.models import Queue, Worker

_names = itertools.count(1)


@pytest.fixture
def make_worker(db) -> Callable[..., Worker]:
    def make(name: str | None = None, endpoint: str = "http://127.0.0.1:9/", **kw) -> Worker:
        kw.setdefault("rps", 1000)  # tests of rate limits set their own
        return Worker.objects.create(name=name or f"worker_{next(_names)}", endpoint=endpoint, **kw)

    return make


@pytest.fixture
def make_queue(db, make_worker) -> Callable[..., Queue]:
    def make(binding_key: str = "#", name: str | None = None, worker: Worker | None = None, **kw):
        return Queue.objects.create(
            name=name or f"queue_{next(_names)}",
            binding_key=binding_key,
            worker=worker or make_worker(),
            **kw,
        )

    return make


@pytest.fixture
def events_on(db) -> Iterator[None]:
    """Operational events on for the test (committed, so that dispatchers' own sessions see
    it), off again after: the switch is a row of pgmb.event_settings, which a test's
    flush does not reset."""
    with psycopg.connect(**conninfo_from_django("default"), autocommit=True) as conn:
        conn.execute("SELECT pgmb.set_events(true)")
        try:
            yield
        finally:
            conn.execute("SELECT pgmb.set_events(false)")


@contextmanager
def _raises_sql(sqlstate: str, match: str = "") -> Iterator[pytest.ExceptionInfo]:
    """Expect a database error with this SQLSTATE, inside a savepoint so the test goes on."""
    with pytest.raises(Exception) as info, transaction.atomic():
        yield info
    cause = info.value.__cause__ if not isinstance(info.value, psycopg.Error) else info.value
    assert isinstance(cause, psycopg.Error), f"not a database error: {info.value!r}"
    assert cause.sqlstate == sqlstate, f"SQLSTATE {cause.sqlstate} ({cause}), wanted {sqlstate}"
    assert match.lower() in str(cause).lower(), f"{match!r} not in {cause}"


@pytest.fixture
def raises_sql():
    return _raises_sql


@pytest.fixture
def sql(db) -> Callable[..., list[tuple]]:
    """Run SQL on the test's connection and return all rows (or [] for no result)."""

    def run(statement: str, params: tuple | dict | None = None) -> list[tuple]:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    return run


def _capabilities() -> indb.Capabilities:
    with connection.cursor() as cursor:
        return indb.capabilities(cursor)


@pytest.fixture
def needs_pg_cron(db) -> None:
    """Skip, saying why, where the server does not preload pg_cron."""
    if not _capabilities().pg_cron_preloaded:
        pytest.skip(
            "pg_cron is not preloaded in this server (the builds of make test's version "
            "matrix have no pg_cron: scripts/fetch_postgres.py)"
        )


@pytest.fixture
def needs_plpython(db) -> None:
    """Skip, saying why, where the test database has no plpython3u (the migration creates it
    where the server can; pgmb's PL/Python transport comes with it)."""
    if not _capabilities().plpython_installed:
        pytest.skip(
            "plpython3u is not in the test database: this server cannot create it (the builds "
            "of make test's version matrix link it against a Python that is not installed)"
        )


#: The views left by queues gone: each queue's pair selects from one of these (views.sql).
_ORPHAN_QUEUE_VIEWS = """
SELECT DISTINCT format('%I.%I', n.nspname, c.relname)
FROM pg_depend d
JOIN pg_rewrite r ON r.oid = d.objid
JOIN pg_class c ON c.oid = r.ev_class
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE d.refobjid IN ('pgmb.queue_entries'::regclass, 'pgmb.dead_letter_entries'::regclass)
  AND c.oid <> d.refobjid
  AND NOT EXISTS (SELECT 1 FROM pgmb_queue q
                  WHERE c.relname IN (pgmb.view_base(q.name) || '_queue',
                                      pgmb.view_base(q.name) || '_dead_letter_queue'))
"""


@pytest.fixture(autouse=True)
def _queue_views_leave_with_their_queues(request, django_db_blocker) -> Iterator[None]:
    """A transactional test's database is emptied by TRUNCATE, which fires no trigger: the
    views of the queues it made would stay for the tests after it to see. Autouse fixtures
    are torn down last, after the flush, when every such view is an orphan."""
    yield
    marker = request.node.get_closest_marker("django_db")
    transactional = "transactional_db" in request.fixturenames or (
        marker is not None and marker.kwargs.get("transaction", False)
    )
    if not transactional:
        return
    databases = (marker.kwargs.get("databases") if marker else None) or ["default"]
    for alias in connections if databases == "__all__" else databases:
        with django_db_blocker.unblock(), connections[alias].cursor() as cursor:
            cursor.execute(_ORPHAN_QUEUE_VIEWS)
            for (view,) in cursor.fetchall():
                cursor.execute(f"DROP VIEW IF EXISTS {view}")


@pytest.fixture(scope="session")
def certificate(tmp_path_factory) -> Path:
    """A self-signed certificate for 127.0.0.1 (key and certificate in one PEM file), for
    the TLS servers of the tests."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (make deps installs it)")
    pem = tmp_path_factory.mktemp("tls") / "localhost.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(pem), "-out", str(pem)],
        check=True, capture_output=True,
    )  # fmt: skip
    return pem


# A real HTTP server on loopback that records requests and answers as scripted.
from tests.faults import claims_refused, faulty_world  # noqa: E402, F401
from tests.httpserver import make_recording_server, recording_server  # noqa: E402, F401
from tests.processes import manage_process  # noqa: E402, F401
from tests.spans import spans  # noqa: E402, F401
