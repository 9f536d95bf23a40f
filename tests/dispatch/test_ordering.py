"""Ordered groups and dependencies under real dispatchers: three pgmb_dispatch processes
claim concurrently from one queue and POST to a real HTTP server on loopback that fails
the first attempt of every message (docs/ordering.md)."""

from __future__ import annotations

import threading
from collections import defaultdict

import pgmb
from pgmb.models import Attempt, DeadLetter, Delivery
from tests.httpserver import Record, Reply
from tests.waiting import wait_until


def _flaky_endpoint():
    """Fails each message's first request (500) and the messages marked "always"; answers
    the others after a short pause, so that requests of different groups overlap."""
    seen: set[str] = set()
    lock = threading.Lock()

    def answer(record: Record) -> Reply:
        body = record.json()
        with lock:
            first = body["id"] not in seen
            seen.add(body["id"])
        if first or body.get("always"):
            return Reply(status=500, body="try again")
        return Reply(status=200, delay=0.02)

    return answer


def test_groups_deliver_in_order_one_at_a_time_under_concurrent_dispatchers_and_failures(
    spawn, recording_server, make_worker, make_queue
):
    recording_server.respond(_flaky_endpoint())
    queue = make_queue(
        "#",
        worker=make_worker(endpoint=recording_server.url(), rps=1000),
        max_retries=3,
        backoff_base=0,
        backoff_max=0,
    )
    groups = ["a", "b", "c", "d"]
    outgoing = [
        pgmb.Outgoing("job", {"id": f"{g}{n}", "group": g, "n": n}, group=g)
        for n in range(6)
        for g in groups
    ]
    # The head of group "dead" never succeeds: dead-lettered after max_retries=1, it frees
    # its group. A plain message depends on group a's last member.
    dead = [
        pgmb.Outgoing(
            "job",
            {"id": "x0", "group": "dead", "n": 0, "always": True},
            group="dead",
            max_retries=1,
        ),
        pgmb.Outgoing("job", {"id": "x1", "group": "dead", "n": 1}, group="dead"),
    ]
    ids = pgmb.send_batch(outgoing + dead)
    last_of_a = ids[groups.index("a") + 5 * len(groups)]
    after = pgmb.send("job", {"id": "after", "group": None, "n": 0}, depends_on=[last_of_a])
    assert Delivery.objects.filter(state="waiting").count() == 4 * 5 + 1 + 1
    for _ in range(3):
        spawn("--queue", queue.name, "--poll-interval", "0.05")

    wait_until(
        lambda: not Delivery.objects.exists(),
        message=lambda: f"{Delivery.objects.count()} deliveries left",
    )
    assert list(DeadLetter.objects.values_list("message_id", flat=True)) == [ids[len(outgoing)]]

    by_group: dict[str, list[tuple[int, int]]] = defaultdict(list)
    first, last = {}, {}
    for i, record in enumerate(recording_server.requests):
        body = record.json()
        first.setdefault(body["id"], i)
        last[body["id"]] = i
        if body["group"] is not None:
            status = record.reply.status if record.reply else None
            by_group[body["group"]].append((body["n"], status))
    for group in groups:
        # Each member: one failure, then its success, before the next member is sent at all.
        assert by_group[group] == [(n, s) for n in range(6) for s in (500, 200)], group
    assert by_group["dead"] == [(0, 500), (0, 500), (1, 500), (1, 200)]
    # The dependent went out after its dependency succeeded.
    assert first["after"] > last["a5"]
    assert Attempt.objects.filter(message_id=after, outcome="ack").exists()
    # Different groups did run in parallel.
    assert recording_server.max_in_flight >= 2
