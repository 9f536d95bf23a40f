"""The recording HTTP server the delivery tests rely on (tests/httpserver.py)."""

from __future__ import annotations

import asyncio
import http.client
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import pytest
import requests

from tests.httpserver import (
    RecordingServer,
    hangup,
    held,
    reply,
    reset,
    retry_after,
    slow,
)
from tests.waiting import wait_until

# The fixtures recording_server and make_recording_server come from tests/conftest.py.


def test_records_each_request(recording_server):
    before_mono, before_wall = time.monotonic(), time.time()
    answer = requests.post(
        recording_server.url("/hook?x=1&y=two"),
        json={"order": 7},
        headers={"X-Pgmb-Message-Id": "m-1"},
        timeout=5,
    )
    assert answer.status_code == 200 and answer.content == b""

    (record,) = recording_server.wait_for(1)
    assert record.method == "POST"
    assert record.path == "/hook"
    assert record.query == {"x": "1", "y": "two"} and record.query_string == "x=1&y=two"
    assert record.headers["x-pgmb-message-id"] == record.headers["X-PGMB-MESSAGE-ID"] == "m-1"
    assert record.headers["Content-Type"] == "application/json"
    assert record.body == b'{"order": 7}' and record.json() == {"order": 7}
    assert before_mono <= record.received_at <= time.monotonic()
    assert before_wall - 1 <= record.received_wall <= time.time() + 1
    assert record.peer is not None and record.peer[0] == "127.0.0.1"
    assert record.reply is not None and record.reply.status == 200


def test_url_and_port(recording_server):
    assert recording_server.port > 0
    assert recording_server.url() == f"http://127.0.0.1:{recording_server.port}/"
    assert recording_server.url("x/y") == f"http://127.0.0.1:{recording_server.port}/x/y"


def test_respond_sets_the_default_reply(recording_server):
    recording_server.respond(201, {"ok": True})
    answer = requests.get(recording_server.url(), timeout=5)
    assert answer.status_code == 201
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.json() == {"ok": True}

    recording_server.respond(503, "busy")
    answer = requests.get(recording_server.url(), timeout=5)
    assert (answer.status_code, answer.text) == (503, "busy")
    assert answer.headers["Content-Type"] == "text/plain; charset=utf-8"

    recording_server.respond(202, b"\x00raw", headers={"Content-Type": "x/y", "X-A": "1"})
    answer = requests.get(recording_server.url(), timeout=5)
    assert (answer.status_code, answer.content) == (202, b"\x00raw")
    assert answer.headers["Content-Type"] == "x/y" and answer.headers["X-A"] == "1"


def test_script_is_used_in_order_then_the_default(recording_server):
    recording_server.respond(204)
    recording_server.script([500, reply(503, "later"), reply(200, b"ok")])
    assert recording_server.scripted_left() == 3
    statuses = [requests.get(recording_server.url(), timeout=5).status_code for _ in range(5)]
    assert statuses == [500, 503, 200, 204, 204]
    assert recording_server.scripted_left() == 0
    assert [r.reply.status for r in recording_server.requests] == statuses


def test_scripts_and_defaults_per_path(recording_server):
    recording_server.script([500], path="/a")
    recording_server.respond(418, path="/b")
    recording_server.script([502])
    assert recording_server.scripted_left("/a") == 1

    def status(path: str) -> int:
        return requests.get(recording_server.url(path), timeout=5).status_code

    # A path's own queue first, then the queue for any path, then the path's default.
    assert status("/a") == 500
    assert status("/b") == 502
    assert status("/b") == 418
    assert status("/a") == 200
    assert status("/c") == 200


def test_a_function_can_answer(recording_server):
    recording_server.respond(lambda record: reply(200, {"echo": record.json()}))
    recording_server.script([lambda record: 409 if record.json()["n"] == 1 else 200])
    first = requests.post(recording_server.url(), json={"n": 1}, timeout=5)
    second = requests.post(recording_server.url(), json={"n": 2}, timeout=5)
    assert first.status_code == 409
    assert second.json() == {"echo": {"n": 2}}


def test_reset_aborts_the_connection(recording_server):
    recording_server.script([reset()])
    with pytest.raises(requests.ConnectionError) as info:
        requests.post(recording_server.url(), data=b"x", timeout=5)
    assert "reset" in str(info.value).lower()
    assert requests.get(recording_server.url(), timeout=5).status_code == 200
    first, _ = recording_server.requests
    assert first.body == b"x" and first.reply.action == "reset"


def test_hangup_closes_without_answering(recording_server):
    recording_server.script([hangup()])
    conn = http.client.HTTPConnection("127.0.0.1", recording_server.port, timeout=5)
    conn.request("GET", "/")
    with pytest.raises(http.client.RemoteDisconnected):
        conn.getresponse()
    conn.close()


def test_retry_after_helper(recording_server):
    recording_server.script([retry_after(7), retry_after(2, status=503, body="slow down")])
    first = requests.get(recording_server.url(), timeout=5)
    second = requests.get(recording_server.url(), timeout=5)
    assert (first.status_code, first.headers["Retry-After"]) == (429, "7")
    assert (second.status_code, second.headers["Retry-After"], second.text) == (
        503,
        "2",
        "slow down",
    )


def test_slow_reply_is_recorded_on_arrival(recording_server):
    gate = threading.Event()
    recording_server.script([held(gate, body="late")])
    outcome: dict = {}

    def call() -> None:
        outcome["text"] = requests.get(recording_server.url(), timeout=120).text

    thread = threading.Thread(target=call)
    thread.start()
    try:
        (record,) = recording_server.wait_for(1)  # while the answer is held back
        assert recording_server.in_flight == 1 and "text" not in outcome
        assert record.reply is not None and record.reply.gate is gate
    finally:
        gate.set()
    thread.join(timeout=60)
    assert outcome["text"] == "late"
    assert recording_server.in_flight == 0


def test_slow_reply_waits_its_delay(recording_server):
    recording_server.script([slow(0.6, body="late")])
    started = time.monotonic()
    assert requests.get(recording_server.url(), timeout=120).text == "late"
    assert time.monotonic() - started >= 0.6  # not earlier; later on a busy machine


def test_slow_reply_lets_a_client_time_out(recording_server):
    recording_server.respond(200, delay=2.0)
    with pytest.raises(requests.Timeout):
        requests.get(recording_server.url(), timeout=0.2)


def test_wait_for_times_out(recording_server):
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="0 request"):
        recording_server.wait_for(1, timeout=0.2)
    assert 0.2 <= time.monotonic() - started < 30  # not before its timeout; no hang


def test_clear_forgets_requests(recording_server):
    requests.get(recording_server.url(), timeout=5)
    recording_server.clear()
    assert recording_server.requests == []
    requests.get(recording_server.url("/again"), timeout=5)
    assert [r.path for r in recording_server.wait_for(1)] == ["/again"]


def test_methods_forms_and_large_bodies(recording_server):
    big = b"z" * (3 * 1024 * 1024)  # more than aiohttp's default 1 MiB limit
    requests.put(recording_server.url("/big"), data=big, timeout=10)
    requests.post(recording_server.url("/form"), data={"a": "x y", "b": ""}, timeout=5)
    requests.head(recording_server.url("/h"), timeout=5)
    requests.request("PURGE", recording_server.url("/p"), timeout=5)
    big_one, form, head, purge = recording_server.wait_for(4)
    assert big_one.method == "PUT" and big_one.body == big
    assert form.form() == {"a": "x y", "b": ""}
    assert (head.method, purge.method) == ("HEAD", "PURGE")


def test_a_hundred_parallel_requests_are_answered_together(recording_server):
    gate = threading.Event()
    recording_server.respond(held(gate))

    def call(i: int) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", recording_server.port, timeout=10)
        try:
            conn.request("POST", f"/p/{i}", body=b"{}")
            return conn.getresponse().status
        finally:
            conn.close()

    # Every answer is held back until all 100 requests are in: only a server that
    # handles them in parallel gets there.
    with ThreadPoolExecutor(max_workers=100) as pool:
        try:
            answers = [pool.submit(call, i) for i in range(100)]
            wait_until(
                lambda: recording_server.in_flight == 100,
                message=lambda: f"100 requests in flight ({recording_server.in_flight})",
            )
        finally:
            gate.set()
        statuses = [answer.result(timeout=60) for answer in answers]
    assert statuses == [200] * 100
    paths = sorted(r.path for r in recording_server.requests)
    assert paths == sorted(f"/p/{i}" for i in range(100))
    assert recording_server.max_in_flight == 100


def test_thousands_of_requests(recording_server):
    """Not a benchmark: a dispatcher test may send thousands of requests at once."""
    count = 3000

    async def blast() -> list[int]:
        connector = aiohttp.TCPConnector(limit=64)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one(i: int) -> int:
                async with session.post(recording_server.url(f"/n/{i}"), data=b"{}") as answer:
                    await answer.read()
                    return answer.status

            return await asyncio.gather(*(one(i) for i in range(count)))

    statuses = asyncio.run(blast())
    assert statuses == [200] * count
    received = recording_server.wait_for(count)
    assert sorted(r.path for r in received) == sorted(f"/n/{i}" for i in range(count))


def test_stop_closes_the_port():
    server = RecordingServer().start()
    port = server.port
    assert requests.get(server.url(), timeout=5).status_code == 200
    server.stop()
    server.stop()  # a second stop is harmless
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 2):
        pass


def test_context_manager_cuts_off_a_slow_reply():
    outcome: list = []
    with RecordingServer() as server:
        server.respond(200, delay=600)
        thread = threading.Thread(target=_call, args=(server.url(), outcome))
        thread.start()
        server.wait_for(1)
        port = server.port
    # Leaving the block cut the connection: the client got no answer (nor waited 10 minutes
    # for one, nor timed out), and the port is closed.
    thread.join(timeout=60)
    assert not thread.is_alive()
    [error] = outcome
    assert isinstance(error, requests.ConnectionError), repr(error)
    assert not isinstance(error, requests.Timeout), repr(error)
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 2):
        pass


def _call(url: str, outcome: list) -> None:
    try:
        outcome.append(requests.get(url, timeout=300))
    except requests.RequestException as exc:
        outcome.append(exc)


def test_factory_gives_independent_servers(make_recording_server):
    first, second = make_recording_server(), make_recording_server()
    assert first.port != second.port
    first.respond(500)
    assert requests.get(first.url(), timeout=5).status_code == 500
    assert requests.get(second.url(), timeout=5).status_code == 200
    assert len(first.requests) == len(second.requests) == 1
