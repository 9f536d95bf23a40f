"""One process, several databases: one :class:`~.engine.Dispatcher` per database alias, on
one event loop.

Each engine has its own connections, LISTEN, reconnect backoff, heartbeats (in its own
database's ``pgmb_dispatcher``), reclaims, HTTP session and slots; nothing is shared but
the loop and the process. A fault in one database is that database's outcome: an outage is
waited out by the engine itself (:class:`~.database.Database`), and an engine that fails
for any other reason (pgmb not migrated there, a bug) is logged and started again after a
backoff, while the others go on. SIGTERM and SIGINT stop every engine, each finishing and
releasing its own deliveries.

While more than one database is served, every line the dispatcher logs starts with the
alias of the database it is about (``[orders] database unavailable …``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import signal
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..db.backoff import Backoff
from ..db.error_text import first_line
from ..db.reconnecting import Unavailable
from .engine import Dispatcher, Options, Stats

log = logging.getLogger("pgmb.dispatch")

#: The alias of the database the running task serves; None: do not tag log lines. Tasks
#: copy the context they are created in, so an engine's own tasks (listener, flusher,
#: requests) carry the alias of the task that started it.
SERVING: contextvars.ContextVar[str | None] = contextvars.ContextVar("pgmb_serving", default=None)

#: The longest wait before an engine that failed (not an outage: that the engine waits out
#: itself, at most half a second apart) is started again. A failure that repeats, such as
#: a database pgmb is not migrated in, is then logged every few seconds, not twice a second.
RESTART_CAP = 5.0


class _Tag(logging.Filter):
    """Starts each record of the dispatch logger with the alias its task serves."""

    def filter(self, record: logging.LogRecord) -> bool:
        alias = SERVING.get()
        if alias is not None and not getattr(record, "pgmb_database", None):
            setattr(record, "pgmb_database", alias)  # noqa: B010 (not a declared attribute)
            record.msg = f"[{alias.replace('%', '%%')}] {record.msg}"
        return True


@dataclass
class Served:
    """What serving one database came to."""

    alias: str
    #: The counts of every engine that ran for it (one, unless one failed and restarted).
    stats: Stats = field(default_factory=Stats)
    #: Why it was given up (--until-idle, --give-up-after), or None.
    gave_up: str | None = None

    def add(self, stats: Stats) -> None:
        self.stats.claimed += stats.claimed
        self.stats.delivered += stats.delivered
        self.stats.failed += stats.failed
        self.stats.released += stats.released


class Supervisor:
    """Serves several databases (alias → psycopg connection arguments) with one set of
    options, each by an engine of its own; see the module's docstring."""

    def __init__(
        self,
        conninfos: dict[str, dict[str, Any]],
        options: Options,
        direct: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """``direct``: for an alias served through a pooler, the connection arguments of the
        same database without it (LISTEN and housekeeping)."""
        if not conninfos:
            raise ValueError("no database to serve")
        self.options = options
        self._conninfos = conninfos
        self._direct = direct or {}
        self._stopping = asyncio.Event()
        self._engines: dict[str, Dispatcher] = {}
        self.served = {alias: Served(alias) for alias in conninfos}

    def stop(self) -> None:
        """Stop every engine: in-flight requests finish, unstarted ones are released."""
        self._stopping.set()
        for alias, engine in self._engines.items():
            contextvars.copy_context().run(self._stop_one, alias, engine)

    def _stop_one(self, alias: str, engine: Dispatcher) -> None:
        if len(self._conninfos) > 1:
            SERVING.set(alias)  # in a copy of the context, for the engine's log line
        engine.stop()

    async def run(self) -> dict[str, Served]:
        """Serve until stopped, every database idle (``until_idle``) or out of time."""
        loop = asyncio.get_running_loop()
        tag = _Tag()
        log.addFilter(tag)
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop)
        deadline = time.monotonic() + self.options.max_seconds if self.options.max_seconds else None
        try:
            await asyncio.gather(*(self._serve(alias, deadline) for alias in self._conninfos))
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
            log.removeFilter(tag)
        return self.served

    async def _serve(self, alias: str, deadline: float | None) -> None:
        """Run engines for one database until one ends normally, or it is given up."""
        if len(self._conninfos) > 1:
            SERVING.set(alias)  # this task's context, copied by the engine's tasks
        served = self.served[alias]
        backoff = Backoff(cap=RESTART_CAP)
        failing_since: float | None = None
        while not self._stopping.is_set():
            options = self.options
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                options = replace(options, max_seconds=left)
            engine = self._engines[alias] = Dispatcher(
                self._conninfos[alias], options, self._direct.get(alias)
            )
            try:
                served.add(await engine.run(signals=False))
                return
            except Unavailable as exc:
                served.add(engine.stats)
                served.gave_up = f"is {exc}"
                log.error("gave up on the database: it is %s", exc)
                return
            except Exception as exc:
                served.add(engine.stats)
                now = time.monotonic()
                if engine.stats.claimed:  # it worked for a while: a new spell of failures
                    failing_since = None
                    backoff.reset()
                first = failing_since is None
                if failing_since is None:
                    failing_since = now
                give_up_after = options.give_up_after
                if give_up_after is not None and now - failing_since >= give_up_after:
                    failing = f"{now - failing_since:.0f}s"
                    served.gave_up = f"kept failing for {failing}: {first_line(exc, typed=True)}"
                    log.error("gave up on the database: it %s", served.gave_up)
                    return
                delay = backoff.next()
                # The traceback once a spell: a failure that repeats is the same failure.
                log.error(
                    "dispatcher failed (%s); starting it again in %.1fs",
                    first_line(exc, typed=True),
                    delay,
                    exc_info=first,
                )
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay)
