"""Concurrent readers on real connections: no message is read twice within its visibility
timeout, and every message is read."""

from __future__ import annotations

import threading
from collections import Counter

import psycopg
import pytest

import pgmb
from pgmb.db.conninfo import conninfo_from_django

pytestmark = pytest.mark.django_db(transaction=True)


def _readers(queue: str, count: int, vt: float, qty: int, delete: bool) -> list[int]:
    """``count`` threads, each on its own connection, read until the queue is empty."""
    seen: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(count)
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            with psycopg.connect(**conninfo_from_django("default"), autocommit=True) as conn:
                start.wait()
                while True:
                    ids = [
                        r[0]
                        for r in conn.execute(
                            "SELECT delivery_id FROM pgmb.read(%s, %s, %s)", (queue, vt, qty)
                        )
                    ]
                    if not ids:
                        return
                    with lock:
                        seen.extend(ids)
                    if delete:
                        conn.execute("SELECT pgmb.delete(%s, %s::bigint[])", (queue, ids))
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return seen


@pytest.mark.parametrize("delete", [False, True], ids=["read only", "read and delete"])
def test_concurrent_readers_never_share_a_message(make_pull_queue, delete):
    queue = make_pull_queue()
    pgmb.send_batch(("k", n) for n in range(2000))
    # The timeout outlasts the test: a message read twice would be a broken lock.
    seen = _readers(queue.name, 4, 3600, 7, delete)
    counts = Counter(seen)
    assert len(seen) == 2000, f"{len(seen)} reads for 2000 messages"
    assert max(counts.values()) == 1
    with psycopg.connect(**conninfo_from_django("default")) as conn:
        (left,) = conn.execute(
            "SELECT count(*) FROM pgmb_delivery d JOIN pgmb_queue q ON q.id = d.queue_id "
            "WHERE q.name = %s",
            (queue.name,),
        ).fetchone()
    assert left == (0 if delete else 2000)
