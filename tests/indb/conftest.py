"""The in-database dispatcher: a procedure CALLed on its own autocommit connection (it
COMMITs), posting through the http stand-in (tests/pg_http) or PL/Python."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest

from pgmb.db.conninfo import conninfo_from_django
from tests.roles import login_role, owner  # noqa: F401 (fixtures)
from tests.waiting import wait_until

TRANSPORTS = ["http", "plpython3u"]


@pytest.fixture
def pg(transactional_db) -> Iterator[psycopg.Connection]:
    conn = psycopg.connect(**conninfo_from_django("default"), autocommit=True)
    yield conn
    conn.close()


@pytest.fixture(params=TRANSPORTS)
def transport(request, pg) -> Iterator[str]:
    """Run the test once with each transport; the http extension is dropped afterwards."""
    if request.param == "http":
        available = pg.execute(
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'http'"
        ).fetchone()[0]
        if not available:
            pytest.skip("the http stand-in is not installed (tests/pg_http/install.sh, as root)")
        try:
            pg.execute("CREATE EXTENSION IF NOT EXISTS http CASCADE")
        except psycopg.Error as exc:  # the stand-in runs on plpython3u, which may not load
            pytest.skip(f"the http extension cannot be created on this server: {exc}")
    else:
        pg.execute("DROP EXTENSION IF EXISTS http")
        if pg.execute("SELECT pgmb.http_transport()").fetchone()[0] != "plpython3u":
            pytest.skip("plpython3u is not installed in the test database")
    assert pg.execute("SELECT pgmb.http_transport()").fetchone()[0] == request.param
    yield request.param
    pg.execute("DROP EXTENSION IF EXISTS http")


@pytest.fixture
def dispatch_loop(pg) -> Callable[..., None]:
    def call(seconds: float = 1.0, batch: int = 50) -> None:
        pg.execute("CALL pgmb.dispatch_loop(%s, %s)", (seconds, batch))

    return call


@pytest.fixture
def dispatch_until(dispatch_loop) -> Callable[..., None]:
    """CALL the dispatch loop, a short run at a time, until ``predicate()`` holds.

    A run lasts its seconds whatever it gets done; on a busy machine one run may do little,
    so tests wait for the outcome they expect rather than for a run of a given length.
    """

    def run(predicate: Callable[[], object], message: str, seconds: float = 1.0) -> None:
        def one_more_run() -> object:
            dispatch_loop(seconds)
            return predicate()

        wait_until(one_more_run, message=message, interval=0)

    return run


class BackgroundLoop:
    """``CALL pgmb.dispatch_loop`` on a connection of its own, in a thread, until stopped."""

    def __init__(self, seconds: float, batch: int, settings: dict[str, str]) -> None:
        self.conn = psycopg.connect(**conninfo_from_django("default"), autocommit=True)
        for name, value in settings.items():
            self.conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        self.pid = self.conn.info.backend_pid
        self.ended: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(seconds, batch), daemon=True)
        self.thread.start()

    def _run(self, seconds: float, batch: int) -> None:
        try:
            self.conn.execute("CALL pgmb.dispatch_loop(%s, %s)", (seconds, batch))
        except psycopg.Error as exc:  # cancelled or terminated by the test
            self.ended.append(exc)

    def running(self, pg: psycopg.Connection) -> bool:
        """Whether the CALL is still on (its backend is in it)."""
        return bool(
            pg.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND query LIKE 'CALL pgmb.%%'"
                " AND state = 'active'",
                (self.pid,),
            ).fetchall()
        )

    def stop(self, pg: psycopg.Connection) -> None:
        """Cancel the CALL (what it has not committed is lost) and close its connection."""
        if self.thread.is_alive():
            pg.execute("SELECT pg_cancel_backend(%s)", (self.pid,))
            self.thread.join(timeout=60)
        self.conn.close()


@pytest.fixture
def start_loop(pg) -> Iterator[Callable[..., BackgroundLoop]]:
    """Start the in-database loop in the background (``settings``: its session's GUCs);
    loops still running are cancelled after the test."""
    loops: list[BackgroundLoop] = []

    def start(
        seconds: float = 60.0, batch: int = 50, settings: dict[str, str] | None = None
    ) -> BackgroundLoop:
        loop = BackgroundLoop(seconds, batch, settings or {})
        loops.append(loop)
        return loop

    yield start
    for loop in loops:
        loop.stop(pg)
