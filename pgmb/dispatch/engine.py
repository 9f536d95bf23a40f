"""The dispatch loop: claim due deliveries, POST them, record each outcome.

One :class:`Dispatcher` serves one database; a process serving several runs one each
(:mod:`.supervisor`). Several may run against one database, on one machine or several:
claims skip what another holds, rate limits live in Postgres.
Outcomes are written in small batches by a separate task on its own connection, so a
slow or failing request never delays or rolls back the record of another.

Claims run up to a batch (at most ``concurrency``) ahead of the requests, so that the
requests never wait for a claim's round trip; a claimed row that waited so long for a
slot that its lease could run out is handed back rather than posted.

A claim counts an attempt, which a lease that expires unstarted hands back: each request
marks its delivery started (``pgmb.start``) with the next write of outcomes, a few
milliseconds later at most, so that a dispatcher killed with rows claimed ahead, or waiting
for their worker's pacing, spends no attempt of theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .. import breakers, deliveries, tracing
from ..conf import Settings
from ..db.error_text import first_line
from ..db.reconnecting import Database, Unavailable, listen
from ..db.statements import Call
from ..deliveries import Claimed, Failure, Success
from ..housekeeping import Thresholds
from ..worker_request import build_headers
from .client import Outcome, new_session, own_failure, post
from .housekeeper import Housekeeper
from .outcome_writer import OutcomeWriter
from .pacing import UNPACED_RPS, Pacer
from .registration import Registration

log = logging.getLogger("pgmb.dispatch")
T = TypeVar("T")

#: Seconds a stopping dispatcher keeps trying to record outcomes if the database is away.
SHUTDOWN_GRACE = 10.0


@dataclass(frozen=True)
class Options:
    """How a dispatcher runs (see ``manage.py pgmb_dispatch --help``); the defaults are
    the settings' (:class:`pgmb.conf.Settings`)."""

    queues: list[str] | None = None
    concurrency: int = Settings.DISPATCH_CONCURRENCY
    batch: int = Settings.DISPATCH_BATCH
    poll_interval: float = Settings.DISPATCH_POLL_INTERVAL
    reclaim_interval: float = Settings.DISPATCH_RECLAIM_INTERVAL
    until_idle: bool = False
    max_seconds: float | None = None
    #: Exit with :class:`Unavailable` once the database has been unreachable this long
    #: (None: keep trying; a dispatcher that runs as a service should).
    give_up_after: float | None = None
    body_limit: int = Settings.RESPONSE_BODY_LIMIT
    #: Seconds between heartbeats in pgmb_dispatcher (the SQL view pgmb.dispatchers).
    heartbeat_interval: float = Settings.DISPATCH_HEARTBEAT_INTERVAL
    #: Seconds between looks at pgmb_delivery's indexes (pgmb.housekeeping), each once
    #: work has been drained (0: never; the command sets PGMB['HOUSEKEEPING_INTERVAL']).
    housekeeping_interval: float = 0.0
    housekeeping_thresholds: Thresholds = field(default_factory=Thresholds)
    #: Once it has drained its work, a vacuum of pgmb_delivery (pgmb.housekeeping.avacuum)
    #: if at least this many deliveries were claimed since the last (0: never; the command
    #: sets PGMB['HOUSEKEEPING_VACUUM_EVERY']).
    vacuum_every: int = 0


@dataclass
class Stats:
    claimed: int = 0
    delivered: int = 0
    failed: int = 0
    released: int = 0
    started: float = field(default_factory=time.monotonic)

    def summary(self) -> str:
        seconds = time.monotonic() - self.started
        return (
            f"claimed={self.claimed} delivered={self.delivered} failed={self.failed} "
            f"released={self.released} seconds={seconds:.1f} "
            f"per_second={self.delivered / seconds if seconds else 0:.0f}"
        )


class Dispatcher:
    """One database's dispatch loop: claims, requests in flight and their outcomes.

    The rest has objects of its own: writing outcomes
    (:class:`~.outcome_writer.OutcomeWriter`), the dispatcher's row
    (:class:`~.registration.Registration`), housekeeping
    (:class:`~.housekeeper.Housekeeper`).
    """

    def __init__(
        self, conninfo: dict[str, Any], options: Options, direct: dict[str, Any] | None = None
    ) -> None:
        """``direct``: the same database's connection arguments without the pooler that
        ``conninfo`` goes through (``PGMB["DIRECT_DATABASES"]``), for LISTEN and
        housekeeping, which need a session of their own."""
        self.options = options
        self.stats = Stats()
        self._conninfo = conninfo
        self._session_conninfo = direct or conninfo
        self._stopping = asyncio.Event()
        # Circuit breakers announce their transitions on the connection that made them
        # (a claim, an outcome): logged as they come, no query of their own.
        self._claims = Database(
            conninfo,
            "claims",
            setup="claims_session",
            interrupt=self._stopping,
            notices=breakers.log_notice,
        )
        self.outcomes = OutcomeWriter(
            Database(conninfo, "outcomes", notices=breakers.log_notice), options.batch
        )
        self._claims.give_up_after = self.outcomes.db.give_up_after = options.give_up_after
        self._wake = asyncio.Event()
        #: Set by the listener when it cannot LISTEN (through a transaction pooler): the
        #: loop polls and never marks itself waiting.
        self._deaf = asyncio.Event()
        # The writer's own containers and event, under names of the loop's: a delivery
        # records its outcome without a call or a lookup more.
        self._outcome_ready = self.outcomes.ready
        # Claims run ahead of the requests: up to `_prefetch` claimed rows wait in `_ready`
        # for a slot, so that a slot freed while a claim is on its way is filled at once.
        # (Claiming only for free slots would leave half the slots idle during each
        # claim's round trip, holding deliveries/s to a third of the HTTP client's.) A claim
        # is sent once `_claim_at` rows or more can be taken: one query per freed slot
        # would cost more than it brings.
        self._prefetch = min(options.batch, options.concurrency)
        self._most = options.concurrency + self._prefetch
        self._claim_at = max(1, self._prefetch // 2)
        #: Claimed rows not started yet, each with the loop time its claim was sent.
        self._ready: deque[tuple[Claimed, float]] = deque()
        #: Rows whose lease would run out before they could be posted; handed back.
        self._stale: list[Claimed] = []
        #: Whether the last claim got all it asked for: then freed slots ask for more;
        #: otherwise nothing more is due, and NOTIFY, next_wakeup or the poll wakes the loop.
        self._more_due = True
        #: This dispatcher's row in pgmb_dispatcher: heartbeats and the waiting mark.
        self._registration = Registration(self._claims, options.queues, options.poll_interval)
        self._inflight: dict[asyncio.Task, Claimed] = {}
        self._posting: set[asyncio.Task] = set()
        self._acks = self.outcomes.acks
        self._fails = self.outcomes.fails
        self._starts = self.outcomes.starts
        self._pacers: dict[str, Pacer] = {}
        self._housekeeper = Housekeeper(
            self._session_conninfo,
            options.vacuum_every,
            options.housekeeping_interval,
            options.housekeeping_thresholds,
        )

    def stop(self) -> None:
        """Stop claiming; in-flight requests finish, unstarted ones are released."""
        if not self._stopping.is_set():
            log.info("stopping: finishing %d in-flight deliveries", len(self._inflight))
            self._stopping.set()
            self._wake.set()

    async def run(self, *, signals: bool = True) -> Stats:
        """Dispatch until stopped, idle (``until_idle``) or out of time; the stats.

        ``signals=False`` leaves SIGTERM and SIGINT to the caller: a loop that runs several
        dispatchers (:mod:`.supervisor`) stops them all from one handler.
        """
        loop = asyncio.get_running_loop()
        handled = (signal.SIGTERM, signal.SIGINT) if signals else ()
        for sig in handled:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop)
        self._session = new_session(self.options.concurrency)
        listener = asyncio.create_task(
            listen(self._session_conninfo, self._wake, self.options.poll_interval, self._deaf)
        )
        flusher = asyncio.create_task(self.outcomes.run(self._wake, self._idle))
        gave_up: Unavailable | None = None
        try:
            await self._loop()
        except Unavailable as exc:
            # Asked to stop while the database was away: shut down all the same. Otherwise
            # the database stayed away longer than the dispatcher may wait: say so.
            if not self._stopping.is_set():
                gave_up = exc
        finally:
            listener.cancel()
            # Outcomes and releases get a grace period if the database is away right now.
            grace = time.monotonic() + SHUTDOWN_GRACE
            self._claims.give_up_at = self.outcomes.db.give_up_at = grace
            await self._drain()
            self.outcomes.close()
            try:
                await flusher
            except Unavailable as exc:
                log.error(
                    "could not record %d outcomes (database unavailable: %s); their leases "
                    "will expire and they will be delivered again",
                    len(self._acks) + len(self._fails),
                    exc,
                )
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            await self._housekeeper.cancel()
            await self._registration.stop(self.stats.delivered, self.stats.failed)
            await self._session.close()
            await self._claims.close()
            await self.outcomes.db.close()
            for sig in handled:
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
        log.info("dispatcher stopped %s", self.stats.summary())
        if gave_up is not None:
            raise gave_up
        return self.stats

    async def _loop(self) -> None:
        opts = self.options
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + opts.max_seconds if opts.max_seconds else None
        next_reclaim = next_beat = next_fire = 0.0
        while not self._stopping.is_set():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            if now >= next_beat:
                await self._beat()
                next_beat = now + opts.heartbeat_interval
            # Cleared before claiming: a NOTIFY that arrives during the claim still wakes us.
            self._wake.clear()
            if now >= next_reclaim:
                if reclaimed := await self._claim_side(deliveries.reclaim_expired_call(), 0):
                    log.info("reclaimed expired leases count=%d", reclaimed)
                if expired := await self._claim_side(deliveries.expire_call(), 0):
                    log.info("expired deliveries (TTL) count=%d", expired)
                next_reclaim = now + opts.reclaim_interval
            if now >= next_fire:
                # Schedules due (pgmb.fire_due_schedules), in their own transaction; looked
                # at again when the next one is due, and at least every reclaim interval
                # (one made meanwhile also wakes the loop through pgmb.next_wakeup).
                fired, fire_in = await self._claim_side(deliveries.fire_schedules_call(), (0, None))
                if fired:
                    log.info("fired schedules count=%d", fired)
                next_fire = now + min(
                    opts.reclaim_interval, opts.reclaim_interval if fire_in is None else fire_in
                )
            if self._stale:
                stale, self._stale = self._stale, []
                await self._release(stale)
            held = len(self._inflight) + len(self._ready)
            want = min(opts.batch, self._most - held)
            if held and want < self._claim_at:
                want = 0
            if want > 0:
                # Leases are counted from before the query: never later than the server's.
                sent = loop.time()
                rows = await self._claim_side(deliveries.claim_call(opts.queues, want), [])
                self._ready.extend((row, sent) for row in rows)
                self.stats.claimed += len(rows)
                self._start_ready()
                self._more_due = len(rows) == want
                if self._more_due:
                    await self._registration.mark_busy()
                    continue  # there may be more due right now
            timeout = opts.poll_interval
            if want > 0 and self._deaf.is_set():
                # No LISTEN (through a pooler): publishers need not NOTIFY this dispatcher.
                await self._registration.mark_busy()
            elif want > 0 and not self._registration.settled:
                settle_in = await self._registration.mark_idle()
                if settle_in == 0:
                    continue  # claim once more: what was committed before the mark
                timeout = min(timeout, settle_in)
            if want > 0:
                if self._wake.is_set():
                    # Woken during the claim (a NOTIFY, most often): claim again at once
                    # rather than first ask when to. At a steady trickle of messages this
                    # halves the queries per message.
                    continue
                if not self._inflight and not self._ready and not self.outcomes.unflushed():
                    # Outcomes written first: a vacuum then finds the drained rows gone.
                    self._housekeeper.start_if_due(self.stats.claimed)
                idle = opts.until_idle and not self._inflight and not self.outcomes.unflushed()
                if idle and not await self._claims.run(deliveries.busy_call(opts.queues)):
                    await self._housekeeper.wait()  # what was drained is tidied before exit
                    return
                wake_in = await self._claims.run(deliveries.next_wakeup_call(opts.queues))
                if wake_in is not None:
                    timeout = min(timeout, max(wake_in, 0.001))
            timeout = min(timeout, max(next_fire - time.monotonic(), 0.001))
            if deadline is not None:
                timeout = min(timeout, max(deadline - time.monotonic(), 0))
            # Heartbeats fall due during a long wait: each is sent and the wait goes on
            # (a beat is not a reason to claim; NOTIFY, the poll and next_wakeup are).
            until = time.monotonic() + timeout
            while (beat_in := next_beat - time.monotonic()) < until - time.monotonic():
                if await self._sleep(max(beat_in, 0.001)) or self._stopping.is_set():
                    break
                await self._beat()
                next_beat = time.monotonic() + opts.heartbeat_interval
            else:
                await self._sleep(max(until - time.monotonic(), 0))

    async def _beat(self) -> None:
        stats = self.stats
        await self._registration.beat(len(self._inflight), stats.delivered, stats.failed)

    async def _claim_side(self, call: Call[T], refused: T) -> T:
        """Run a reclaim or a claim; one the database refuses (not an outage, which
        ``Database.run`` waits out) is logged and read as ``refused``, so the loop goes on
        and tries again at its next turn instead of ending."""
        try:
            return await self._claims.run(call)
        except Unavailable:
            raise
        except Exception as exc:
            log.error(
                "the database refused a state-machine call (%s: %s); trying again later",
                type(exc).__name__,
                first_line(exc),
            )
            return refused

    async def _sleep(self, timeout: float) -> bool:
        """Wait until woken, or for ``timeout`` seconds; True if woken.

        The event stays set until the loop clears it before its next claim: a wake-up that
        comes as the wait times out is not lost.
        """
        if self._wake.is_set():
            return True
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except asyncio.TimeoutError:
            return self._wake.is_set()
        return True

    def _start_ready(self) -> None:
        """Start claimed rows while there are free slots."""
        ready, inflight, concurrency = self._ready, self._inflight, self.options.concurrency
        now = asyncio.get_running_loop().time()
        while ready and len(inflight) < concurrency:
            row, claimed = ready.popleft()
            if now + row.timeout >= claimed + row.lease_seconds and (
                row.lease_seconds > row.timeout or now - claimed > row.lease_seconds / 4
            ):
                # It waited so long for a slot that its lease could run out mid-request and
                # another dispatcher post it too: hand it back instead. (Where the lease is
                # shorter than the timeout anyway, short waits are let through.)
                self._stale.append(row)
                self._wake.set()
                continue
            task = asyncio.create_task(self._deliver(row))
            inflight[task] = row
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task) -> None:
        self._inflight.pop(task, None)
        self._posting.discard(task)
        if self._ready and not self._stopping.is_set():
            self._start_ready()
        # Wake the loop only when it has something to do: claim (more is due and a claim's
        # worth of rows can be taken), or, with --until-idle, see whether all is done. When
        # the last claim found nothing more due, a free slot changes nothing: NOTIFY, the
        # next due time or the poll wakes the loop (one claim per message less, at low rates).
        if (
            self._more_due and self._most - len(self._inflight) - len(self._ready) >= self._claim_at
        ) or (self.options.until_idle and not self._inflight):
            self._wake.set()

    async def _deliver(self, row: Claimed) -> None:
        if row.rps < UNPACED_RPS:  # skips a coroutine and a lookup per request otherwise
            pacer = self._pacers.get(row.worker_id)
            if pacer is None:
                pacer = self._pacers[row.worker_id] = Pacer()
            await pacer.wait(row.rps)
        # current_task() is None only outside a task, and _deliver always runs in one.
        self._posting.add(asyncio.current_task())  # type: ignore[arg-type]
        self._starts[row.delivery_id] = row
        self._outcome_ready.set()
        started = time.perf_counter()
        span: tracing.AttemptSpan | None = None
        try:
            body = row.body.encode()
            headers = build_headers(
                message_id=row.message_id,
                routing_key=row.routing_key,
                queue=row.queue,
                attempt=row.attempt,
                headers=row.headers,
                body=body,
                secrets=row.secrets,
                timestamp=int(time.time()),
            )
            if tracing.traced(row.headers):
                span = tracing.AttemptSpan(
                    row.headers, queue=row.queue, message_id=row.message_id, attempt=row.attempt
                )
                span.inject(headers)
            outcome = await post(
                self._session, row.endpoint, body, headers, row.timeout, self.options.body_limit
            )
        except Exception as exc:
            # Whatever one delivery does wrong (a secret that cannot be decoded, a bug) is
            # that delivery's failed attempt, never a dead task holding its lease.
            outcome = own_failure(
                (time.perf_counter() - started) * 1000,
                f"could not send the request: {type(exc).__name__}: {exc}",
            )
        if span is not None:
            span.end(outcome.status, outcome.duration_ms, outcome.error, outcome.ok)
        self._record(row, outcome)

    def _record(self, row: Claimed, outcome: Outcome) -> None:
        if self._starts.get(row.delivery_id) is row:
            del self._starts[row.delivery_id]
        if outcome.ok:
            self.stats.delivered += 1
            self._acks.append(Success(row.delivery_id, outcome.status, outcome.duration_ms))
            level, what = logging.DEBUG, "delivered"
        else:
            self.stats.failed += 1
            self._fails.append(
                Failure(
                    row.delivery_id,
                    row.lease_id,
                    outcome.status,
                    outcome.error,
                    outcome.retry_after,
                    outcome.duration_ms,
                )
            )
            if row.last_attempt:
                level, what = logging.WARNING, "dead-lettered"
            else:
                level, what = logging.INFO, "failed, will retry"
        if log.isEnabledFor(level):
            log.log(
                level,
                "%s queue=%s message_id=%s attempt=%d/%d status=%s duration_ms=%.1f%s",
                what,
                row.queue,
                row.message_id,
                row.attempt,
                row.max_attempts,
                outcome.status if outcome.status is not None else "-",
                outcome.duration_ms,
                f" error={outcome.error[:200]!r}" if outcome.error else "",
            )
        self._outcome_ready.set()

    def _idle(self) -> bool:
        """With --until-idle, whether nothing is in flight (the loop may be done)."""
        return self.options.until_idle and not self._inflight

    async def _drain(self) -> None:
        """On the way out: release what was claimed but not yet posted, finish the rest."""
        released = [row for row, _ in self._ready] + self._stale
        self._ready.clear()
        self._stale = []
        waiting = [t for t in self._inflight if t not in self._posting]
        for task in waiting:
            task.cancel()
        released += [self._inflight[t] for t in waiting]
        if self._inflight:
            await asyncio.wait(list(self._inflight))
        if released:
            try:
                await self._release(released)
            except Unavailable:
                log.error(
                    "could not release %d deliveries; their leases will expire", len(released)
                )

    async def _release(self, rows: list[Claimed]) -> None:
        """Hand claimed rows back unattempted."""
        self.stats.released += await self._claims.run(deliveries.release_call(rows))
