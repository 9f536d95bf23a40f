"""Known data for the metrics: deliveries in every state, dead letters, and attempts inside
and outside the last hour, their times set explicitly relative to the transaction's now()
(constant for the whole test, which runs in one transaction)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pgmb.models import Queue, Worker


@dataclass
class World:
    busy: Queue  # every kind of delivery and attempt
    side: Queue  # the same worker, one recent success
    idle: Queue  # another worker, nothing at all, paused
    worker: Worker
    idle_worker: Worker


def add_delivery(sql, queue, *, state="ready", attempts=0, available="0s", created="0s"):
    sql(
        "INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at,"
        " created_at, lease_id, last_error)"
        " VALUES (gen_random_uuid(), %s, %s, %s, now() + %s::interval, now() + %s::interval,"
        " CASE WHEN %s = 'leased' THEN gen_random_uuid() END, '')",
        (queue.pk, state, attempts, available, created, state),
    )


def add_attempt(sql, queue, outcome, ago, *, status=None, duration=None, error=""):
    sql(
        "INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code,"
        " duration_ms, error, created_at)"
        " VALUES (gen_random_uuid(), %s, 1, %s, %s, %s, %s, now() - %s::interval)",
        (queue.pk, outcome, status, duration, error, ago),
    )


def add_dead_letter(sql, queue):
    sql(
        "INSERT INTO pgmb_dead_letter (message_id, queue_id, attempts, last_status,"
        " last_error, created_at) VALUES (gen_random_uuid(), %s, 6, 503, 'busy', now())",
        (queue.pk,),
    )


@pytest.fixture
def world(sql, make_worker, make_queue) -> World:
    worker = make_worker("metrics_worker")
    idle_worker = make_worker("idle_worker")
    busy = make_queue("busy.#", name="busy_queue", worker=worker)
    side = make_queue("side.#", name="side_queue", worker=worker)
    idle = make_queue("idle.#", name="idle_queue", worker=idle_worker, paused=True)

    # busy_queue: four due (one of them a retry published 200 s ago: the oldest due), two
    # delayed (the newest was published 1 s ago), a retry not due yet published 1000 s
    # ago, one leased.
    for created in ("-100s", "-50s", "-10s"):
        add_delivery(sql, busy, available="-5s", created=created)
    add_delivery(sql, busy, attempts=1, available="-1s", created="-200s")
    add_delivery(sql, busy, available="1h", created="-1s")
    add_delivery(sql, busy, available="1h", created="-3s")
    add_delivery(sql, busy, attempts=2, available="30s", created="-1000s")
    add_delivery(sql, busy, state="leased", attempts=1, available="60s", created="-500s")
    add_dead_letter(sql, busy)
    add_dead_letter(sql, busy)
    # Attempts: 3 acks and 3 failures in the last hour, 2 acks and 1 expiry before it.
    add_attempt(sql, busy, "ack", "10 minutes", status=200, duration=10)
    add_attempt(sql, busy, "ack", "11 minutes", status=200, duration=20)
    add_attempt(sql, busy, "ack", "12 minutes", status=200, duration=30)
    add_attempt(sql, busy, "retry", "2 minutes", status=503, duration=40, error="HTTP 503: busy")
    add_attempt(sql, busy, "dead", "3 minutes", status=500, duration=50, error="HTTP 500")
    add_attempt(sql, busy, "retry", "20 minutes", duration=60, error="timeout")
    add_attempt(sql, busy, "ack", "2 hours", status=200, duration=1000)
    add_attempt(sql, busy, "ack", "3 hours", status=200, duration=1000)
    add_attempt(sql, busy, "expired", "2 hours", duration=1000, error="lease expired")
    # side_queue, the same worker: its last success, 5 minutes ago.
    add_attempt(sql, side, "ack", "5 minutes", status=204, duration=70)
    return World(busy, side, idle, worker, idle_worker)
