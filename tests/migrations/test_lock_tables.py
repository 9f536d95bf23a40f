"""A release's migration takes its table locks first, all together, never holding some
while it waits long for another (pgmb.sql.operations.lock_tables, run by the LockTables
operation that opens 0002_release_0_1_1; docs/decisions/0062).

The deadlock it avoids, made on purpose: a client holds pgmb_delivery (as ``pgmb.send``
does while it routes) and then asks for pgmb_queue, which the migration took before
asking for pgmb_delivery."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import OperationalError, connection, transaction

from pgmb.db.conninfo import conninfo_from_django
from pgmb.sql.operations import lock_tables
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

#: In the order the migration locks them: pgmb_queue before pgmb_delivery.
TABLES = ("pgmb_worker", "pgmb_queue", "pgmb_message", "pgmb_delivery", "pgmb_attempt")

HELD = """
SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE l.pid = %s AND l.mode = 'AccessExclusiveLock' AND l.granted AND c.relname = ANY (%s)
"""


class Migration(threading.Thread):
    """Runs ``lock`` in a transaction of its own connection, then holds what it took until
    ``finish`` is set."""

    def __init__(self, lock) -> None:
        super().__init__(daemon=True)
        self.lock = lock
        self.pid: int | None = None
        self.locked = threading.Event()
        self.finish = threading.Event()
        self.error: BaseException | None = None
        self.lock_timeout_after = ""

    def run(self) -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                [(self.pid,)] = cursor.fetchall()
                self.lock(cursor)
                cursor.execute("SELECT current_setting('lock_timeout')")
                [(self.lock_timeout_after,)] = cursor.fetchall()
                self.locked.set()
                self.finish.wait(60)
        except BaseException as exc:
            self.error = exc
        finally:
            connection.close()


def _with_lock_tables(**options) -> Migration:
    return Migration(lambda cursor: lock_tables(connection, TABLES, **options))


def _plain_lock() -> Migration:
    return Migration(
        lambda cursor: cursor.execute(f"LOCK TABLE {', '.join(TABLES)} IN ACCESS EXCLUSIVE MODE")
    )


def _client() -> psycopg.Connection:
    """A session holding pgmb_delivery as a send does while it routes."""
    client = psycopg.connect(**conninfo_from_django("default"))
    client.execute("SET statement_timeout = '30s'")
    client.execute("LOCK TABLE pgmb_delivery IN ROW EXCLUSIVE MODE")
    return client


def _holds(pg: psycopg.Connection, migration: Migration, tables: tuple[str, ...]) -> bool:
    return pg.execute(HELD, (migration.pid, list(tables))).fetchone() == (len(tables),)


def test_the_migration_lets_go_while_it_waits_so_a_client_never_deadlocks_with_it():
    with psycopg.connect(**conninfo_from_django("default"), autocommit=True) as pg:
        client = _client()
        migration = _with_lock_tables()
        migration.start()
        # Caught holding pgmb_queue while it waits for the client's pgmb_delivery.
        wait_until(
            lambda: migration.pid and _holds(pg, migration, ("pgmb_worker", "pgmb_queue")),
            message="the migration holding pgmb_queue, waiting for pgmb_delivery",
            interval=0.005,
        )
        # The client asks for pgmb_queue: it waits a moment for the migration to let go,
        # and gets it (no deadlock, no error), while the migration has not got its locks.
        assert client.execute("SELECT count(*) FROM pgmb_queue").fetchone() is not None
        assert not migration.locked.is_set()
        client.commit()  # the send done: now the migration gets all its tables at once
        wait_until(migration.locked.is_set, message="the migration's locks")
        assert _holds(pg, migration, TABLES)
        assert migration.lock_timeout_after == "0"  # the session's own setting, put back
        migration.finish.set()
        migration.join(60)
        assert migration.error is None
        client.close()


def test_without_it_the_same_client_and_migration_deadlock():
    """The control: the migration's locks taken by a plain LOCK TABLE, one after the other,
    waiting as long as it takes. PostgreSQL finds the deadlock and aborts one of the two:
    the client's send, or the migration."""
    with psycopg.connect(**conninfo_from_django("default"), autocommit=True) as pg:
        client = _client()
        migration = _plain_lock()
        migration.start()
        wait_until(
            lambda: migration.pid and _holds(pg, migration, ("pgmb_worker", "pgmb_queue")),
            message="the migration holding pgmb_queue, waiting for pgmb_delivery",
        )
        client_error = None
        try:
            client.execute("SELECT count(*) FROM pgmb_queue")
        except psycopg.errors.DeadlockDetected as exc:
            client_error = exc
        client.rollback()
        migration.finish.set()
        migration.join(60)
        aborted = [e for e in (client_error, migration.error) if e is not None]
        assert len(aborted) == 1, aborted
        assert "deadlock detected" in str(aborted[0])
        client.close()


def test_it_gives_up_with_a_clear_error_when_the_tables_stay_held():
    client = _client()
    migration = _with_lock_tables(give_up_after=0.3)
    migration.start()
    migration.join(60)
    assert isinstance(migration.error, OperationalError)
    assert "could not lock pgmb_worker, pgmb_queue" in str(migration.error)
    assert "run it again" in str(migration.error)
    # The client's transaction went on undisturbed.
    assert client.execute("SELECT count(*) FROM pgmb_queue").fetchone() is not None
    client.commit()
    client.close()
