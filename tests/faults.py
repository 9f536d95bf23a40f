"""Faults at the boundaries, injected the same way into both dispatch paths
(tests/dispatch/test_faults.py, tests/indb/test_faults.py): a fault is an outcome, not a
crash. Whatever one worker, one message or one response does wrong is recorded against that
delivery, and every other delivery arrives."""

from __future__ import annotations

import pytest
from django.db import connection

import pgmb
from pgmb.models import Attempt, DeadLetter, Delivery, Message
from tests.stored_rows import store_with_triggers_off, triggers_off

NORMAL = 12


@pytest.fixture
def faulty_world(recording_server, make_worker, make_queue):
    """A healthy queue beside queues whose workers or responses are broken in every way
    found so far, and a poison message among normal ones. Returns the normal ids."""
    server = recording_server
    server.respond(500, body=b"broken \x00 body", path="/nul")
    server.respond(503, body="later", headers={"Retry-After": "\u00b2"}, path="/odd-retry-after")
    server.respond(429, headers={"Retry-After": "tomorrow"}, path="/date-retry-after")
    server.respond(500, path="/huge-timeout")
    good = make_queue("#", name="good", worker=make_worker(endpoint=server.url("/good")))
    bad = {
        "bad_secret": make_worker(endpoint=server.url("/secret")),
        "bad_port": make_worker(endpoint=server.url("/port")),  # 99999, stored below
        "nul_body": make_worker(endpoint=server.url("/nul")),
        "odd_retry": make_worker(endpoint=server.url("/odd-retry-after")),
        "date_retry": make_worker(endpoint=server.url("/date-retry-after")),
        # A timeout no HTTP client or socket can take as it is (stored below).
        "huge_timeout": make_worker(endpoint=server.url("/huge-timeout")),
    }
    for name, worker in bad.items():
        make_queue("#", name=name, worker=worker, max_retries=0)
    store_with_triggers_off(
        "UPDATE pgmb_worker SET secret = 'whsec_a' WHERE id = %s", (bad["bad_secret"].pk,)
    )
    # A port out of range, which the endpoint rule refuses now (a row stored before it).
    store_with_triggers_off(
        "UPDATE pgmb_worker SET endpoint = 'http://127.0.0.1:99999/x' WHERE id = %s",
        (bad["bad_port"].pk,),
    )
    # Longer than any lease, which the worker_timeout trigger refuses now.
    store_with_triggers_off(
        "UPDATE pgmb_worker SET timeout = 1e300 WHERE id = %s", (bad["huge_timeout"].pk,)
    )
    good.max_retries = 0
    good.save()
    ids = [pgmb.send("k", {"n": n}) for n in range(NORMAL // 2)]
    # A header value no server takes: the message fails everywhere, and only there. Publish
    # refuses it now (docs/decisions/0031): a row stored before the limit still holds it.
    poison = pgmb.send("k", {"poison": True})
    with triggers_off():
        Message.objects.filter(pk=poison).update(headers={"huge": "x" * 100_000})
    ids += [pgmb.send("k", {"n": n}) for n in range(NORMAL // 2, NORMAL)]
    return {"server": server, "good": good, "bad": bad, "ids": ids, "queues": 1 + len(bad)}


def check_faulty_world(world) -> None:
    """Normal messages arrived; each faulty delivery is a dead letter with its reason."""
    arrived = [r for r in world["server"].requests if r.path == "/good"]
    ids = {r.headers["pgmb-message-id"] for r in arrived}
    assert ids >= {str(i) for i in world["ids"]}, "a normal message did not arrive"
    assert not Delivery.objects.exists(), "a delivery was left leased or pending"
    # Every bad queue's deliveries are dead letters with the reason recorded.
    for name in world["bad"]:
        dead = DeadLetter.objects.filter(queue__name=name)
        assert dead.count() == NORMAL + 1, name
        assert all(d.last_error for d in dead), name
    errors = dict(
        DeadLetter.objects.filter(queue__name__in=["bad_secret", "bad_port"]).values_list(
            "queue__name", "last_error"
        )
    )
    assert "secret" in errors["bad_secret"].lower()
    assert DeadLetter.objects.filter(queue__name="bad_port", last_status=None).count() == NORMAL + 1
    assert DeadLetter.objects.filter(queue__name="nul_body", last_status=500).count() >= NORMAL
    # One attempt recorded per delivery: none vanished, none was posted twice.
    assert Attempt.objects.count() == world["queues"] * (NORMAL + 1)


#: How many claims ``claims_refused`` makes the database refuse before it accepts them.
REFUSALS = 2


@pytest.fixture
def claims_refused(transactional_db):
    """The database refuses the next claims (an error raised by a trigger on the deliveries'
    UPDATE, as a stored value a claim cannot compute would make it), then accepts them."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            CREATE SEQUENCE pgmb_test_refusals;
            CREATE FUNCTION pgmb_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF nextval('pgmb_test_refusals') <= {REFUSALS:d} THEN
                    RAISE EXCEPTION 'refused by the test';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER pgmb_test_refuse BEFORE UPDATE ON pgmb_delivery
                FOR EACH ROW WHEN (NEW.state = 'leased') EXECUTE FUNCTION pgmb_test_refuse();
            """
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute(
            "DROP TRIGGER pgmb_test_refuse ON pgmb_delivery; DROP FUNCTION pgmb_test_refuse();"
            " DROP SEQUENCE pgmb_test_refusals"
        )
