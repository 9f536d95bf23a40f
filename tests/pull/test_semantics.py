"""One table of cases, each run through the SQL functions (schema pgmb) and through
pgmb.pull: same results, same rows written."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

import pgmb
from pgmb.models import Attempt, DeadLetter, Delivery
from tests.pull.apis import APIS
from tests.waiting import wait_until

pytestmark = pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)


def _publish(n: int, key: str = "job.run", **kw) -> list:
    return [pgmb.send(key, {"n": i}, **kw) for i in range(n)]


def _outcomes(queue) -> list[tuple[str, int]]:
    return sorted(Attempt.objects.filter(queue=queue).values_list("outcome", "attempt"))


def test_read_takes_the_oldest_visible_and_hides_them_for_vt(api, make_pull_queue):
    queue = make_pull_queue("job.*")
    _publish(5)
    first = api.read(queue.name, 30, 2)
    assert [(body, ct) for _, body, ct in first] == [({"n": 0}, 1), ({"n": 1}, 1)]
    rest = api.read(queue.name, 30, 10)
    assert [body["n"] for _, body, _ in rest] == [2, 3, 4]
    assert api.read(queue.name, 30, 10) == []  # all within their visibility timeout
    # A read writes no history; the deliveries stay 'ready', counted and hidden.
    assert _outcomes(queue) == []
    assert set(Delivery.objects.filter(queue=queue).values_list("state", "attempts")) == {
        ("ready", 1)
    }


def test_a_message_whose_timeout_ran_out_is_read_again_at_once(api, make_pull_queue):
    queue = make_pull_queue()
    _publish(1)
    [(handle, _, ct)] = api.read(queue.name, 0, 1)  # vt 0: visible again at once
    assert ct == 1
    assert api.read(queue.name, 0.2, 1) == [(handle, {"n": 0}, 2)]
    # No dispatcher runs: the expiry alone makes it readable.
    again = wait_until(lambda: api.read(queue.name, 30, 1), message="the read again")
    assert again == [(handle, {"n": 0}, 3)]


def test_filter_by_body_and_header_containment(api, make_pull_queue):
    queue = make_pull_queue()
    pgmb.send("k", {"kind": "a", "n": 1}, headers={"tenant": "x"})
    pgmb.send("k", {"kind": "b", "n": 2}, headers={"tenant": "x"})
    pgmb.send("k", {"kind": "a", "n": 3}, headers={"tenant": "y"})
    assert [b["n"] for _, b, _ in api.read(queue.name, 30, 10, {"body": {"kind": "a"}})] == [1, 3]
    pgmb.send("k", {"kind": "b", "n": 4}, headers={"tenant": "y", "p": 1})
    got = api.read(queue.name, 30, 10, {"body": {"kind": "b"}, "headers": {"tenant": "y"}})
    assert [b["n"] for _, b, _ in got] == [4]
    assert [b["n"] for _, b, _ in api.read(queue.name, 30, 10, {})] == [2]


def test_set_vt_hides_and_shows(api, make_pull_queue):
    queue = make_pull_queue()
    _publish(2)
    [(a, _, _), (b, _, _)] = api.read(queue.name, 30, 2)
    assert [r[0] for r in api.set_vt(queue.name, [a], 0)] == [a]
    assert api.read(queue.name, 30, 5) == [(a, {"n": 0}, 2)]
    # And back: a message not yet read can be hidden too.
    [(c, _, _)] = [(h, x, y) for h, x, y in api.set_vt(queue.name, [b], 3600)]
    assert c == b
    assert api.read(queue.name, 30, 5) == []


def test_delete_acknowledges_and_skips_settled_ids(api, make_pull_queue):
    queue = make_pull_queue()
    _publish(3)
    reads = api.read(queue.name, 30, 3)
    handles = [r[0] for r in reads]
    assert api.delete(queue.name, handles[:2]) == handles[:2]
    assert api.delete(queue.name, handles[:2]) == []  # settled already: skipped
    assert _outcomes(queue) == [("ack", 1), ("ack", 1)]
    assert list(Delivery.objects.filter(queue=queue).values_list("id", flat=True)) == handles[2:]


def test_archive_settles_with_its_own_outcome(api, make_pull_queue):
    queue = make_pull_queue()
    _publish(2)
    handles = [r[0] for r in api.read(queue.name, 30, 2)]
    assert api.archive(queue.name, handles[:1]) == handles[:1]
    assert api.delete(queue.name, handles[1:]) == handles[1:]
    assert _outcomes(queue) == [("ack", 1), ("archived", 1)]
    assert not Delivery.objects.filter(queue=queue).exists()
    # Counted as neither delivered nor failed.
    metrics = pgmb.metrics.queue(queue.name)
    assert (metrics.delivered_last_hour, metrics.failed_last_hour) == (1, 0)


def test_pop_reads_and_deletes(api, make_pull_queue):
    queue = make_pull_queue()
    _publish(3)
    assert [(b, ct) for _, b, ct in api.pop(queue.name, 2)] == [({"n": 0}, 1), ({"n": 1}, 1)]
    assert _outcomes(queue) == [("ack", 1), ("ack", 1)]
    assert Delivery.objects.filter(queue=queue).count() == 1


def test_purge_empties_the_queue(api, make_pull_queue):
    queue = make_pull_queue()
    other = make_pull_queue()
    _publish(4)
    api.read(queue.name, 30, 1)
    assert api.purge(queue.name) == 4
    assert not Delivery.objects.filter(queue=queue).exists()
    assert Delivery.objects.filter(queue=other).count() == 4
    assert _outcomes(queue) == []


def test_reads_never_deleted_end_in_the_dead_letters(api, make_pull_queue):
    queue = make_pull_queue(max_retries=1)
    _publish(1)
    for read in (1, 2):  # 1 + max_retries reads
        assert [ct for _, _, ct in api.read(queue.name, 0, 1)] == [read]
    pgmb.send("job.run", {"n": 1})
    # Read number 3 would exceed the limit: dead-lettered, and not returned.
    [(_, body, ct)] = api.read(queue.name, 30, 2)
    assert (body, ct) == ({"n": 1}, 1)
    dead = DeadLetter.objects.get(queue=queue)
    assert dead.attempts == 2
    assert "read 2 times and never deleted" in dead.last_error
    assert _outcomes(queue) == [("dead", 2)]
    assert Delivery.objects.filter(queue=queue).count() == 1


def test_nack_retries_after_the_backoff_then_dead_letters(api, make_pull_queue):
    queue = make_pull_queue(max_retries=1, backoff_base=3600, backoff_max=3600)
    _publish(1)
    first = api.read(queue.name, 30, 1)
    assert api.nack(queue.name, first, "boom") == 1
    delivery = Delivery.objects.get(queue=queue)
    assert delivery.last_error == "boom"
    assert api.read(queue.name, 30, 1) == []  # backing off (at least half an hour)
    # A stale nack (of a read count the delivery no longer has) changes nothing.
    Delivery.objects.filter(pk=delivery.pk).update(available_at=delivery.created_at)
    second = api.read(queue.name, 30, 1)
    assert [ct for _, _, ct in second] == [2]
    assert api.nack(queue.name, first, "late") == 0
    assert api.nack(queue.name, second, "boom again") == 1  # the last read: dead-lettered
    assert DeadLetter.objects.get(queue=queue).last_error == "boom again"
    assert _outcomes(queue) == [("dead", 2), ("retry", 1)]


def test_paused_queue_reads_nothing(api, make_pull_queue):
    queue = make_pull_queue(paused=True)
    _publish(1)
    assert api.read(queue.name, 30, 1) == []
    assert Delivery.objects.get(queue=queue).attempts == 0


@pytest.mark.django_db(transaction=True)
def test_read_with_poll_returns_what_is_published_while_it_waits(api, make_pull_queue):
    queue = make_pull_queue()
    assert api.read_with_poll(queue.name, 30, 1, 0) == []  # no wait: nothing there

    def publish_once_polling() -> None:
        def polling() -> bool:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s AND state = 'active'"
                    " AND pid <> pg_backend_pid()",
                    ["%read_with_poll%"],
                )
                return cursor.fetchone()[0] > 0

        wait_until(polling, message="the poll to start")
        pgmb.send("k", {"late": True})
        connection.close()

    thread = threading.Thread(target=publish_once_polling)
    thread.start()
    got = api.read_with_poll(queue.name, 30, 1, 60)
    thread.join()
    assert [(b, ct) for _, b, ct in got] == [({"late": True}, 1)]


def test_a_dead_lettered_head_makes_room_for_the_next(api, make_pull_queue):
    queue = make_pull_queue(max_retries=0)
    pgmb.send("k", {"n": 0})
    [(first, _, _)] = api.read(queue.name, 0, 1)
    pgmb.send("k", {"n": 1})
    # The first is due before the second, and its next read would be its second.
    Delivery.objects.filter(pk=first).update(available_at=timezone.now() - timedelta(hours=1))
    assert [(b, ct) for _, b, ct in api.read(queue.name, 30, 1)] == [({"n": 1}, 1)]
    assert list(DeadLetter.objects.filter(queue=queue).values_list("attempts", flat=True)) == [1]


def test_a_read_with_no_timeout_that_dead_letters_returns_each_message_once(api, make_pull_queue):
    # The refill after a dead-lettering must not read again what the same read just made
    # visible again (vt 0).
    queue = make_pull_queue(max_retries=0)
    pgmb.send("k", {"n": 0})
    [(first, _, _)] = api.read(queue.name, 30, 1)
    Delivery.objects.filter(pk=first).update(available_at=timezone.now() - timedelta(hours=1))
    pgmb.send("k", {"n": 1})
    pgmb.send("k", {"n": 2})
    got = api.read(queue.name, 0, 3)
    assert [(b, ct) for _, b, ct in got] == [({"n": 1}, 1), ({"n": 2}, 1)]
    assert list(DeadLetter.objects.filter(queue=queue).values_list("attempts", flat=True)) == [1]
