"""Answers that stop retries, one set of cases for every dispatch path (tests/dispatch and
tests/indb): each case a worker with its lists, a real endpoint answering always the same,
a queue allowing one retry, and what must become of its one message."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pgmb
from pgmb import final_answers
from pgmb.models import Attempt, DeadLetter, Delivery
from tests.httpserver import RecordingServer, reply


@dataclass(frozen=True)
class Case:
    status: int
    dead: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    headers: dict[str, str] | None = None
    #: Requests the endpoint gets before the message is dead-lettered (the queue allows 2).
    attempts: int = 2
    #: How the dead letter's error begins.
    error: str = "HTTP "


CASES = {
    # Listed: one attempt, and the error says why.
    "listed": Case(410, dead=["410"], attempts=1, error="the worker answered 410, which it "),
    # The default: every failure retried, a 410 too.
    "unlisted": Case(410),
    # A class, and a status of it retried all the same.
    "class": Case(404, dead=["4xx"], retried=["408", "429"], attempts=1, error="the worker "),
    "excepted": Case(429, dead=["4xx"], retried=["408", "429"]),
    "other_class": Case(503, dead=["4xx"]),
    # The abort header, its value in any case and with blanks; retried statuses do not
    # keep it from ending the delivery.
    "abort": Case(
        409,
        retried=["409"],
        headers={"Pgmb-Delivery": " Abort"},
        attempts=1,
        error=final_answers.ABORTED,
    ),
    # The header is a list: any item of it will do (repeats come joined so).
    "listed_abort": Case(
        409, headers={"Pgmb-Delivery": "retry,  ABORT "}, attempts=1, error=final_answers.ABORTED
    ),
    "other_header": Case(409, headers={"Pgmb-Delivery": "retry, aborted"}),
}


def arrange(
    make_server: Callable[[], RecordingServer], make_worker, make_queue
) -> dict[str, RecordingServer]:
    """One endpoint, worker and queue per case, and one message each (routing key: the
    case's name)."""
    servers = {}
    for key, case in CASES.items():
        server = make_server()
        server.respond(reply(case.status, f"answer of {key}", headers=case.headers))
        worker = make_worker(
            endpoint=server.url(), dead_statuses=case.dead, retried_statuses=case.retried
        )
        make_queue(key, worker=worker, max_retries=1, backoff_base=0.01, backoff_max=0.02)
        pgmb.send(key, {"case": key})
        servers[key] = server
    return servers


def settled() -> bool:
    return DeadLetter.objects.count() == len(CASES) and not Delivery.objects.exists()


def check(servers: dict[str, RecordingServer]) -> None:
    """Each case's requests, dead letter and history are what it says."""
    dead = {d.message.routing_key: d for d in DeadLetter.objects.select_related("message")}
    for key, case in CASES.items():
        assert len(servers[key].requests) == case.attempts, key
        letter = dead[key]
        assert (letter.attempts, letter.last_status) == (case.attempts, case.status), key
        assert letter.last_error.startswith(case.error), (key, letter.last_error)
        assert f"answer of {key}" in letter.last_error, (key, letter.last_error)
        outcomes = list(
            Attempt.objects.filter(message__routing_key=key)
            .order_by("attempt")
            .values_list("outcome", flat=True)
        )
        assert outcomes == ["retry"] * (case.attempts - 1) + ["dead"], key
