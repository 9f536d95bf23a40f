"""Fair shares per key under real dispatchers posting to a real HTTP server on loopback
(docs/fairness.md): the order the server receives requests in is the order asserted on."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pgmb
from pgmb.models import Attempt, Delivery
from tests.httpserver import Record, Reply
from tests.waiting import wait_until


def _publish(tenant: str, n: int) -> None:
    for start in range(0, n, 1000):
        pgmb.send_batch(
            pgmb.Outgoing("job", {"tenant": tenant, "n": i}, headers={"tenant": tenant})
            for i in range(start, min(n, start + 1000))
        )


def _tenants(records: list[Record]) -> list[str]:
    return [r.json()["tenant"] for r in records]


def test_a_late_tenant_is_delivered_within_the_first_few_hundred(
    dispatch, recording_server, make_worker, make_queue, sql
):
    queue = make_queue(
        "#", worker=make_worker(endpoint=recording_server.url(), rps=100_000), max_retries=0
    )
    sql("SELECT pgmb.fairness(%s, 'tenant')", (queue.name,))
    _publish("a", 10_000)
    _publish("b", 10)
    stats = dispatch(queues=[queue.name], concurrency=32, batch=100)
    order = _tenants(recording_server.requests)
    assert Counter(order) == {"a": 10_000, "b": 10}, stats
    b_at = [i for i, tenant in enumerate(order) if tenant == "b"]
    assert max(b_at) < 300, b_at
    assert not Delivery.objects.exists()
    assert Attempt.objects.filter(outcome="ack").count() == 10_010


def test_a_cap_of_one_keeps_one_request_of_the_key_in_flight_across_dispatchers(
    spawn, recording_server, make_worker, make_queue, sql
):
    delay = 0.05
    recording_server.respond(lambda record: Reply(status=200, delay=delay))
    queue = make_queue(
        "#", worker=make_worker(endpoint=recording_server.url(), rps=100_000), max_retries=0
    )
    sql("SELECT pgmb.fairness(%s, 'tenant')", (queue.name,))
    sql("SELECT pgmb.fair_key(%s, 'one', max_in_flight => 1)", (queue.name,))
    _publish("one", 15)
    _publish("free", 60)
    for _ in range(3):
        spawn("--queue", queue.name, "--concurrency", "16", "--poll-interval", "0.05")
    wait_until(
        lambda: not Delivery.objects.exists(),
        message=lambda: f"{Delivery.objects.count()} deliveries left",
    )
    records = recording_server.requests
    assert Counter(_tenants(records)) == {"one": 15, "free": 60}
    # The server answers a request only `delay` after it arrived: with one request of the
    # key in flight at a time, each of the key's requests arrives after the previous one's
    # answer, so at least `delay` later.
    arrivals = [r.received_at for r in records if r.json()["tenant"] == "one"]
    gaps = [later - earlier for earlier, later in pairwise(arrivals)]
    assert min(gaps) >= delay, gaps
    # The uncapped key's requests did overlap.
    assert recording_server.max_in_flight >= 3


def test_a_key_of_weight_two_gets_about_twice_the_share(
    dispatch, recording_server, make_worker, make_queue, sql
):
    queue = make_queue(
        "#", worker=make_worker(endpoint=recording_server.url(), rps=100_000), max_retries=0
    )
    sql("SELECT pgmb.fairness(%s, 'tenant')", (queue.name,))
    sql("SELECT pgmb.fair_key(%s, 'heavy', 2)", (queue.name,))
    _publish("light", 600)
    _publish("heavy", 600)
    dispatch(queues=[queue.name], concurrency=8, batch=10)
    order = _tenants(recording_server.requests)
    assert Counter(order) == {"light": 600, "heavy": 600}
    first = Counter(order[:600])
    # 400 and 200, within a margin for requests that overtake one another on the way.
    assert 370 <= first["heavy"] <= 430, first
