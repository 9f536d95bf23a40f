"""The in-database loop keeps the outcomes of its requests and commits them together, in
batches bounded by a count (pgmb.indb_commit_every) and by milliseconds
(pgmb.indb_commit_ms): what each bound lets another session see, while a request is held
by the server, and what a backend killed mid-batch leaves behind (nothing lost)."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection

import pgmb
from pgmb import deliveries
from pgmb.models import Attempt, DeadLetter, Delivery, DispatcherProcess
from tests.httpserver import held, reply, retry_after
from tests.waiting import wait_until

#: A bound by milliseconds no test run reaches: only the count decides.
NEVER_MS = "60000"


def _acked() -> set[str]:
    return {str(m) for m in Attempt.objects.filter(outcome="ack").values_list("message", flat=True)}


def test_outcomes_wait_for_the_count_bound(
    transport, start_loop, recording_server, make_worker, make_queue
):
    first_gate, second_gate = threading.Event(), threading.Event()
    # Requests 3 and 7 are held: while each is in flight, the others' outcomes are either
    # in a committed batch or not yet anywhere another session can see.
    recording_server.script([200, 200, held(first_gate), 200, 200, 200, held(second_gate)])
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    ids = [str(i) for i in pgmb.send_batch(("k", n) for n in range(8))]
    try:
        start_loop(settings={"pgmb.indb_commit_every": "3", "pgmb.indb_commit_ms": NEVER_MS})
        recording_server.wait_for(3)
        # Two outcomes kept, fewer than 3: nothing committed yet.
        assert not Attempt.objects.exists()
        assert Delivery.objects.filter(state="leased").count() == 8
        first_gate.set()
        posted = recording_server.wait_for(7)
        # Before requests 4 and 7, a full batch of 3 was committed each time.
        assert _acked() == {r.headers["pgmb-message-id"] for r in posted[:6]}
    finally:
        first_gate.set()
        second_gate.set()
    wait_until(lambda: _acked() == set(ids), message="all 8 messages acked")
    assert not Delivery.objects.exists()
    assert len(recording_server.requests) == 8


def test_the_millisecond_bound_commits_before_a_request_would_hold_an_outcome(
    transport, start_loop, recording_server, make_worker, make_queue
):
    gate = threading.Event()
    # The first answer takes 0.2 s: the next request is expected to take as long, longer
    # than the 50 ms an outcome may wait, so the first outcome is committed before it.
    recording_server.script([reply(200, delay=0.2), held(gate)])
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    first, second = (str(i) for i in pgmb.send_batch([("k", 1), ("k", 2)]))
    try:
        start_loop(settings={"pgmb.indb_commit_every": "50", "pgmb.indb_commit_ms": "50"})
        recording_server.wait_for(2)
        assert _acked() == {first}
        assert Delivery.objects.get(message_id=second).state == "leased"
    finally:
        gate.set()
    wait_until(lambda: _acked() == {first, second}, message="the second message acked")


def test_a_lone_outcome_is_committed_without_waiting_for_more(
    transport, pg, start_loop, recording_server, make_worker, make_queue
):
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    loop = start_loop()  # the defaults: 50 outcomes, 50 ms
    wait_until(lambda: DispatcherProcess.objects.exists(), message="the loop to register")
    for n in range(3):
        # A trickle: one message at a time, each acked while the loop runs on.
        message = str(pgmb.send("k", {"n": n}))
        wait_until(lambda m=message: m in _acked(), message=f"message {n} acked")
        assert loop.running(pg)
    assert not Delivery.objects.exists()


def test_failures_in_a_batch_are_recorded(
    transport, start_loop, recording_server, make_worker, make_queue
):
    recording_server.script([200, 500, 200, retry_after(120), 200])
    make_queue("#", worker=make_worker(endpoint=recording_server.url()), max_retries=1)
    ids = [str(i) for i in pgmb.send_batch(("k", n) for n in range(5))]
    start_loop(settings={"pgmb.indb_commit_every": "50", "pgmb.indb_commit_ms": NEVER_MS})
    wait_until(lambda: Attempt.objects.count() == 5, message="5 outcomes recorded")
    outcomes = dict(Attempt.objects.values_list("message", "outcome"))
    assert {str(m): o for m, o in outcomes.items()} == {
        ids[0]: "ack",
        ids[1]: "retry",
        ids[2]: "ack",
        ids[3]: "retry",
        ids[4]: "ack",
    }
    broken = Delivery.objects.get(message_id=ids[1])
    assert (broken.state, broken.attempts, broken.last_status) == ("ready", 1, 500)
    limited = Delivery.objects.get(message_id=ids[3])
    assert (limited.state, limited.attempts, limited.last_status) == ("ready", 1, 429)
    failed_at = Attempt.objects.get(message_id=ids[3]).created_at
    assert 119 <= (limited.available_at - failed_at).total_seconds() <= 121
    assert Delivery.objects.count() == 2


def test_a_backend_killed_mid_batch_loses_nothing(
    pg, transport, start_loop, recording_server, make_worker, make_queue
):
    gate = threading.Event()
    recording_server.script([200, 200, held(gate)])
    make_queue(
        "#",
        worker=make_worker(endpoint=recording_server.url()),
        max_retries=3,
        lease_seconds=600,
    )
    ids = [str(i) for i in pgmb.send_batch(("k", n) for n in range(6))]
    loop = start_loop(settings={"pgmb.indb_commit_every": "50", "pgmb.indb_commit_ms": NEVER_MS})
    try:
        # The first request alone, then, its answer fast, the other five in one window
        # (PL/Python; the http extension posts one at a time): the third is held.
        posted = recording_server.wait_for(6 if transport == "plpython3u" else 3)
        assert sorted(r.headers["pgmb-message-id"] for r in posted) == sorted(ids[: len(posted)])
        assert posted[0].headers["pgmb-message-id"] == ids[0]
        # Outcomes kept, none committed; the claim committed the first request's mark.
        assert not Attempt.objects.exists()
        marked = Delivery.objects.filter(started=True).values_list("message_id", flat=True)
        assert [str(m) for m in marked] == ids[:1]
        pg.execute("SELECT pg_terminate_backend(%s)", (loop.pid,))
    finally:
        gate.set()
    loop.thread.join(timeout=60)
    assert loop.ended, "the loop's backend was not terminated"
    wait_until(
        lambda: (
            not pg.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (loop.pid,)).fetchall()
        ),
        message="the terminated backend to exit",
    )
    # The batch died with the backend: its requests made, no outcome recorded.
    assert not Attempt.objects.exists()
    assert Delivery.objects.filter(state="leased").count() == 6
    # The leases run out (600 s, brought forward): the marked one counts, the others
    # (posted in the lost batch or never posted) are handed back.
    pg.execute("UPDATE pgmb_delivery SET available_at = now() WHERE state = 'leased'")
    assert deliveries.reclaim_expired() == 6
    history = {str(m): o for m, o in Attempt.objects.values_list("message", "outcome")}
    assert history == {ids[0]: "expired"} | {i: "unsent" for i in ids[1:]}
    pg.execute("UPDATE pgmb_delivery SET available_at = now()")  # the first one's backoff
    start_loop(settings={"pgmb.indb_commit_every": "50", "pgmb.indb_commit_ms": NEVER_MS})
    wait_until(lambda: _acked() == set(ids), message="all 6 messages acked")
    # At least once: every message arrived, those of the lost batch twice.
    arrived = [r.headers["pgmb-message-id"] for r in recording_server.requests]
    assert sorted(arrived) == sorted(ids + ids[: len(posted)])
    assert not Delivery.objects.exists() and not DeadLetter.objects.exists()
    by_message: dict[str, list[tuple[str, int]]] = {}
    for message, outcome, attempt in Attempt.objects.order_by("id").values_list(
        "message", "outcome", "attempt"
    ):
        by_message.setdefault(str(message), []).append((outcome, attempt))
    assert by_message == {ids[0]: [("expired", 1), ("ack", 2)]} | {
        i: [("unsent", 1), ("ack", 1)] for i in ids[1:]
    }


@pytest.fixture
def acks_refused_for(transactional_db):
    """The database refuses the history row of the acks of messages given (a trigger), as
    a value that cannot be stored would; dropped after the test."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE TABLE pgmb_test_refused (message_id uuid PRIMARY KEY);
            CREATE FUNCTION pgmb_test_refuse_ack() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.outcome = 'ack' AND EXISTS (SELECT 1 FROM pgmb_test_refused r
                                                   WHERE r.message_id = NEW.message_id) THEN
                    RAISE EXCEPTION 'refused by the test';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER pgmb_test_refuse_ack BEFORE INSERT ON pgmb_attempt
                FOR EACH ROW EXECUTE FUNCTION pgmb_test_refuse_ack();
            """
        )

    def refuse(message_id: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO pgmb_test_refused VALUES (%s)", (message_id,))

    yield refuse
    with connection.cursor() as cursor:
        cursor.execute(
            "DROP TRIGGER pgmb_test_refuse_ack ON pgmb_attempt;"
            " DROP FUNCTION pgmb_test_refuse_ack(); DROP TABLE pgmb_test_refused"
        )


def test_an_outcome_that_cannot_be_written_does_not_undo_the_others(
    transport, start_loop, acks_refused_for, recording_server, make_worker, make_queue
):
    make_queue("#", worker=make_worker(endpoint=recording_server.url()), lease_seconds=600)
    ids = [str(i) for i in pgmb.send_batch(("k", n) for n in range(5))]
    acks_refused_for(ids[2])
    start_loop(settings={"pgmb.indb_commit_every": "50", "pgmb.indb_commit_ms": NEVER_MS})
    wait_until(lambda: _acked() == set(ids) - {ids[2]}, message="the other 4 acked")
    # Its request was made: it stays leased, marked started, so its expiry counts.
    left = Delivery.objects.get()
    assert (str(left.message_id), left.state, left.started) == (ids[2], "leased", True)
    assert len(recording_server.requests) == 5


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("pgmb.indb_commit_every", "abc"),
        ("pgmb.indb_commit_every", "0"),
        ("pgmb.indb_commit_every", "-1"),
        ("pgmb.indb_commit_every", "1.5"),
        ("pgmb.indb_commit_every", "10001"),
        ("pgmb.indb_commit_every", "99999999999"),
        ("pgmb.indb_commit_ms", "-1"),
        ("pgmb.indb_commit_ms", "fast"),
        ("pgmb.indb_commit_ms", "60001"),
        ("pgmb.indb_commit_ms", "1e3"),
        ("pgmb.indb_commit_ms", "NaN"),
    ],
)
def test_a_bad_commit_bound_stops_the_loop_before_it_writes(
    pg, name, value, recording_server, make_worker, make_queue
):
    make_queue("#", worker=make_worker(endpoint=recording_server.url()))
    pgmb.send("k", {"n": 1})
    pg.execute("SELECT set_config(%s, %s, false)", (name, value))
    with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
        pg.execute("CALL pgmb.dispatch_loop(1, 50)")
    assert f"invalid {name} '{value}'" in str(info.value)
    assert not DispatcherProcess.objects.exists()
    assert Delivery.objects.get().state == "ready"
    assert not recording_server.requests


def test_commit_bounds_defaults_and_settings(pg):
    bounds = "SELECT commit_every, commit_ms FROM pgmb.indb_commit_bounds()"
    assert pg.execute(bounds).fetchone() == (50, 50.0)
    pg.execute("SET pgmb.indb_commit_every = 1")
    pg.execute("SET pgmb.indb_commit_ms = ' 0.5 '")
    assert pg.execute(bounds).fetchone() == (1, 0.5)
    pg.execute("RESET pgmb.indb_commit_every")
    pg.execute("SET pgmb.indb_commit_ms = '60000'")
    assert pg.execute(bounds).fetchone() == (50, 60000.0)


def test_record_outcomes_wants_one_lease_and_outcome_per_delivery(pg, make_queue):
    make_queue("#")
    pgmb.send("k", {"n": 1})
    [(delivery_id, lease_id)] = pg.execute(
        "SELECT delivery_id, lease_id FROM pgmb.claim(NULL, 1)"
    ).fetchall()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="one lease id and one outcome"):
        pg.execute(
            "SELECT pgmb.record_outcomes(%s, %s, ARRAY[]::pgmb.http_outcome[])",
            ([delivery_id], [lease_id]),
        )
    assert (Delivery.objects.get().state, Attempt.objects.count()) == ("leased", 0)
    [(written,)] = pg.execute(
        "SELECT pgmb.record_outcomes(%s, %s, ARRAY[ROW(200, '', NULL, 1.5)::pgmb.http_outcome])",
        ([delivery_id], [lease_id]),
    ).fetchall()
    assert written == 1
    assert not Delivery.objects.exists()
    assert Attempt.objects.get().outcome == "ack"
