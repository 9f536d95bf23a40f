"""Expiry, one set of cases for every dispatch path (tests/dispatch and tests/indb): queues
of one worker (a real endpoint answering 200), each with its messages, the dispatcher run
only once every expiry in the set has passed (waited for in the database, never on the
clock), and what must become of each message: posted, dead-lettered as expired, or dropped.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from django.db import connection

import pgmb
from pgmb.models import Attempt, DeadLetter, Delivery
from tests.httpserver import RecordingServer
from tests.waiting import wait_until

PAST = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
#: A tiny TTL: passed a moment after publication (waited for, see :func:`arrange`).
TINY = 0.001
HOUR = 3600.0


@dataclass(frozen=True)
class Case:
    #: The queue's settings.
    message_ttl: float | None = None
    on_expiry: str = "dead_letter"
    #: The message's own expiry (pgmb.send's keywords).
    ttl: float | None = None
    expires_at: datetime.datetime | None = None
    #: What becomes of it: "posted", "dead" (a dead letter saying it expired) or "dropped".
    outcome: str = "posted"


CASES = {
    "past": Case(expires_at=PAST, outcome="dead"),
    "tiny_ttl": Case(ttl=TINY, outcome="dead"),
    "dropped": Case(expires_at=PAST, on_expiry="drop", outcome="dropped"),
    "queue_ttl": Case(message_ttl=TINY, outcome="dead"),
    "queue_ttl_dropped": Case(message_ttl=TINY, on_expiry="drop", outcome="dropped"),
    # The earlier of the message's and the queue's expiry holds, whichever it is.
    "message_earlier": Case(message_ttl=HOUR, expires_at=PAST, outcome="dead"),
    "queue_earlier": Case(message_ttl=TINY, ttl=HOUR, outcome="dead"),
    # Not expired yet: posted as any other.
    "live": Case(ttl=HOUR),
    "live_by_queue": Case(message_ttl=HOUR),
    "none": Case(),
}

#: A group whose head expired: the member behind it is released and posted.
GROUP = "expiry_group"


def arrange(make_worker, make_queue, server: RecordingServer) -> None:
    """One queue per case (routing key: the case's name) and its message, and a group of
    two on the queue ``expiry_group`` (the first expired); returns once every expiry that
    should have passed has, by the database's clock."""
    worker = make_worker(endpoint=server.url())
    for key, case in CASES.items():
        make_queue(
            key, name=key, worker=worker, message_ttl=case.message_ttl, on_expiry=case.on_expiry
        )
        pgmb.send(key, {"case": key}, ttl=case.ttl, expires_at=case.expires_at)
    make_queue(GROUP, name=GROUP, worker=worker)
    pgmb.send(GROUP, {"case": "group_head"}, group="g", expires_at=PAST)
    pgmb.send(GROUP, {"case": "group_next"}, group="g")

    def passed() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pgmb_delivery WHERE expires_at <= clock_timestamp()"
            )
            return cursor.fetchone()[0] == expected_expired()

    wait_until(passed, message="the tiny TTLs to pass")


def expected_expired() -> int:
    return sum(c.outcome != "posted" for c in CASES.values()) + 1  # the group's head


def settled() -> bool:
    return not Delivery.objects.exists()


def check(server: RecordingServer) -> None:
    """Nothing expired was posted; the rest was; each expired message is a dead letter
    saying so or gone, with one history row of outcome 'ttl'."""
    posted = sorted(r.json()["case"] for r in server.requests)
    wanted = sorted([k for k, c in CASES.items() if c.outcome == "posted"] + ["group_next"])
    assert posted == wanted
    dead = {d.queue.name: d for d in DeadLetter.objects.select_related("queue")}
    assert sorted(dead) == sorted([k for k, c in CASES.items() if c.outcome == "dead"] + [GROUP])
    for letter in dead.values():
        assert letter.last_error.startswith("expired: its time to live ran out"), letter.last_error
        assert letter.attempts == 0
    ttl = sorted(
        Attempt.objects.filter(outcome=Attempt.Outcome.TTL).values_list("queue__name", flat=True)
    )
    assert ttl == sorted([k for k, c in CASES.items() if c.outcome != "posted"] + [GROUP])
    acked = Attempt.objects.filter(outcome=Attempt.Outcome.ACK).count()
    assert acked == len(wanted)
