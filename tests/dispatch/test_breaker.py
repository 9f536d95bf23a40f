"""The circuit breaker with the external dispatcher, against real endpoints on loopback:
one that answers 500, one that is unreachable, one that recovers. What reached the
endpoint, what stayed in the database, and what the log says."""

from __future__ import annotations

import asyncio
import socket

import psycopg
import pytest

import pgmb
from pgmb.db.conninfo import conninfo_from_django
from pgmb.dispatch.engine import Dispatcher, Options
from pgmb.models import Attempt, Delivery, Worker
from tests.waiting import DEADLINE


def _run_until_open(worker: Worker, **options) -> None:
    """Run a dispatcher until the worker's breaker is open, then stop it."""

    async def main() -> None:
        conninfo = conninfo_from_django("default")
        dispatcher = Dispatcher(conninfo, Options(poll_interval=0.05, **options))
        task = asyncio.create_task(dispatcher.run())
        async with await psycopg.AsyncConnection.connect(**conninfo, autocommit=True) as conn:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DEADLINE
            while True:
                cur = await conn.execute(
                    "SELECT breaker_state FROM pgmb_worker WHERE id = %s", (worker.pk,)
                )
                if (await cur.fetchone())[0] == "open":
                    break
                assert loop.time() < deadline, "the breaker never opened"
                assert not task.done(), "the dispatcher stopped"
                await asyncio.sleep(0.02)
        dispatcher.stop()
        await task

    asyncio.run(main())


def _breaker_lines(caplog) -> list[tuple[str, str]]:
    return [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.getMessage().startswith("circuit breaker ")
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("concurrency", [1, 8])
def test_an_endpoint_that_answers_500_is_left_alone_and_its_messages_wait(
    transactional_db, recording_server, make_worker, make_queue, caplog, concurrency
):
    recording_server.respond(500, "down")
    worker = make_worker(
        endpoint=recording_server.url("/hook"),
        breaker_failures=3,
        breaker_cooldown=3600,
        breaker_cooldown_max=3600,
    )
    make_queue("#", worker=worker)
    pgmb.send_batch([("k", n) for n in range(200)])
    with caplog.at_level("INFO", logger="pgmb.dispatch"):
        _run_until_open(worker, concurrency=concurrency, batch=4)
    w = Worker.objects.get(pk=worker.pk)
    assert w.breaker_state == "open"
    assert w.breaker_reason == "3 failures in a row (last: HTTP 500: down)"
    # What was posted before the failures were recorded (outcomes are written every few
    # milliseconds) went on; the rest wait, ready, no attempt spent.
    posted = len(recording_server.requests)
    assert 3 <= posted < 200
    assert Delivery.objects.filter(state="ready").count() == 200
    assert Delivery.objects.filter(attempts=0).count() == 200 - posted
    assert Attempt.objects.filter(outcome="retry").count() == posted
    assert _breaker_lines(caplog) == [
        (
            "WARNING",
            f"circuit breaker worker={w.name} state=open "
            "reason='3 failures in a row (last: HTTP 500: down)'",
        )
    ]


def test_an_unreachable_endpoint_opens_it(transactional_db, make_worker, make_queue, caplog):
    worker = make_worker(
        endpoint=f"http://127.0.0.1:{_free_port()}/",
        breaker_failures=2,
        breaker_cooldown=3600,
        breaker_cooldown_max=3600,
    )
    make_queue("#", worker=worker)
    pgmb.send_batch([("k", n) for n in range(200)])
    with caplog.at_level("INFO", logger="pgmb.dispatch"):
        _run_until_open(worker, concurrency=1, batch=1)
    w = Worker.objects.get(pk=worker.pk)
    assert w.breaker_reason.startswith("2 failures in a row (last: connection failed: ")
    tried = Attempt.objects.count()
    assert 2 <= tried < 200
    assert Delivery.objects.filter(state="ready", attempts=0).count() == 200 - tried
    [(level, line)] = _breaker_lines(caplog)
    assert level == "WARNING" and f"worker={w.name} state=open" in line


def test_an_endpoint_that_recovers_is_probed_then_gets_everything(
    dispatch, recording_server, make_worker, make_queue, caplog
):
    recording_server.script([500] * 5)  # then 200, the default
    worker = make_worker(
        endpoint=recording_server.url("/hook"),
        breaker_failures=3,
        breaker_cooldown=0.3,
        breaker_cooldown_max=0.3,
    )
    make_queue("#", worker=worker, backoff_base=0.1, backoff_max=0.2)
    pgmb.send_batch([("k", n) for n in range(20)])
    with caplog.at_level("INFO", logger="pgmb.dispatch"):
        stats = dispatch(concurrency=1, batch=1)
    assert stats.delivered == 20
    assert not Delivery.objects.exists()
    assert Attempt.objects.filter(outcome="ack").count() == 20
    assert Attempt.objects.exclude(outcome="ack").count() == 5
    assert len(recording_server.requests) == 25
    w = Worker.objects.get(pk=worker.pk)
    assert (w.breaker_state, w.breaker_reason) == ("closed", "the probe succeeded (HTTP 200)")
    # Opened by the run of failures; a probe may have met the last 500s and opened it
    # again; the last probe closed it.
    states = [line.split(" reason=")[0].split("state=")[1] for _, line in _breaker_lines(caplog)]
    assert states[0] == "open" and states[-2:] == ["half-open", "closed"]
    assert states[:-1] == ["open", "half-open"] * (len(states) // 2)
