"""A known message history for the archive's tests, built through pgmb's own API (publish,
claim, ack, fail, purge) and then moved back in time; and what an archive holds.

``build_history`` returns which messages must be archived and which must stay; its
messages have old ids, of days that have no partition (stored in the default partitions)
or, given ``days_ago``, spread over those days' partitions too (made first);
``snapshot`` reads every message and attempt as PostgreSQL has them, in the form the
Parquet archive is read back into (``read_archive``), so that the two compare equal.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import connection

import pgmb
from pgmb import deliveries, ids
from pgmb.deliveries import Failure, Success
from pgmb.models import Queue

#: Days back the "old" history is moved: older than the cutoffs the tests use (5 days).
OLD_DAYS = 6


#: Days back the ids of messages stored in the default partition are: no partition of
#: theirs is ever made (premaking makes today's and later).
STRAY_DAYS = OLD_DAYS


def days_ago(*ages: int) -> list[date]:
    today = datetime.now(UTC).date()
    return [today - timedelta(days=age) for age in ages]


def id_back(days: int) -> uuid.UUID:
    """A new version 7 id whose time is ``days`` days back: ids made in a row keep their
    order."""
    now = ids.uuid7()
    return uuid.UUID(int=now.int - ((days * 86_400_000) << 80))


def spread_ids(days: list[date]) -> Callable[[], uuid.UUID]:
    """Ids of ``days`` (partitions made here) and of the default partition, in turn."""
    if days:
        [(made,)] = _sql("SELECT pgmb.make_history_days(%s, %s)", [min(days), max(days)])
        assert made == 2 * len(days), "the days' partitions existed already"
    today = datetime.now(UTC).date()
    ages: Iterator[int] = itertools.cycle([(today - d).days for d in days] + [STRAY_DAYS])
    return lambda: id_back(next(ages))


def partition_of(message_id: uuid.UUID) -> str | None:
    rows = _sql("SELECT tableoid::regclass::text FROM pgmb_message WHERE id = %s", [message_id])
    return rows[0][0] if rows else None


@dataclass
class History:
    #: Finished and old: archived.
    archived: set[uuid.UUID] = field(default_factory=set)
    #: Unfinished, or not old enough: stay in PostgreSQL.
    kept: set[uuid.UUID] = field(default_factory=set)


def _sql(statement: str, params: Any = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def _deliver(outcome: dict[uuid.UUID, str]) -> None:
    """Claim everything due and settle each claim as ``outcome[message]`` says: "ack" or
    "fail" (retry, or dead letter on the last attempt); release the others."""
    claims = deliveries.claim(None, 1000)
    deliveries.ack(
        [
            Success(c.delivery_id, 200, 12.5)
            for c in claims
            if outcome.get(uuid.UUID(c.message_id)) == "ack"
        ]
    )
    deliveries.fail(
        [
            Failure(c.delivery_id, c.lease_id, 503, "busy: ünïcode \u2603", None, 40.0)
            for c in claims
            if outcome.get(uuid.UUID(c.message_id)) == "fail"
        ]
    )
    deliveries.release(
        [c for c in claims if outcome.get(uuid.UUID(c.message_id)) not in ("ack", "fail")]
    )


def build_history(
    make_queue, *, extra_unrouted: int = 0, days: list[date] | None = None
) -> History:
    """Messages of every kind, on queues orders (order.*), audit (order.#), mail (mail.*,
    no retries) and gone (gone.*, deleted once its messages are acked). Their ids are of
    ``days`` (whose partitions are made) and of the default partition, in turn."""
    old_id = spread_ids(days or [])
    make_queue("order.*", name="orders", backoff_base=0, backoff_max=0)
    make_queue("order.#", name="audit", backoff_base=0, backoff_max=0)
    make_queue("mail.*", name="mail", max_retries=0)
    make_queue("gone.*", name="gone")
    h = History()
    body = {"order": 7, "items": [{"sku": "A-1", "qty": 2}], "note": "naïve ☃", "ok": True}
    acked = pgmb.send(
        "order.created", body, headers={"trace": "t-1", "n": [1, 2]}, message_id=old_id()
    )
    retried = pgmb.send(
        "order.paid", {"order": 8, "amount": 12.75, "none": None}, message_id=old_id()
    )
    purged = pgmb.send("mail.sent", {"to": "a@example.com"}, message_id=old_id())
    unrouted = pgmb.send("nobody.listens", ["a", 1, None], message_id=old_id())
    gone = pgmb.send("gone.away", {"x": 1}, message_id=old_id())
    dead = pgmb.send("mail.bounced", {"to": "b@example.com"}, message_id=old_id())
    live = pgmb.send("order.shipped", {"order": 9}, message_id=old_id())
    late = pgmb.send("order.refunded", {"order": 10}, message_id=old_id())  # acked after the cutoff
    extras = [
        pgmb.send("nobody.at.all", {"n": n}, message_id=old_id()) for n in range(extra_unrouted)
    ]

    # order.paid fails once on orders, then is acked there; everything else as named.
    _deliver({acked: "ack", retried: "fail", purged: "fail", gone: "ack", dead: "fail"})
    _deliver({retried: "ack"})
    deliveries.purge_dead_letters(
        [pk for (pk,) in _sql("SELECT id FROM pgmb_dead_letter WHERE message_id = %s", [purged])]
    )
    Queue.objects.get(name="gone").delete()

    old = [acked, retried, purged, unrouted, gone, dead, live, late, *extras]
    _sql(
        "UPDATE pgmb_message SET created_at = created_at - make_interval(days => %s) "
        "WHERE id = ANY(%s)",
        [OLD_DAYS, old],
    )
    _sql(
        "UPDATE pgmb_attempt SET created_at = created_at - make_interval(days => %s) "
        "WHERE message_id = ANY(%s)",
        [OLD_DAYS, old],
    )
    _deliver({late: "ack"})  # its last attempt is now: not archived yet
    pgmb.send("order.created", {"order": 11})  # new: kept (and delivered, or not)
    h.archived = {acked, retried, purged, unrouted, gone, *extras}
    h.kept = {dead, live, late} | {m for (m,) in _sql("SELECT id FROM pgmb_message")} - h.archived
    return h


def message_ids() -> set[uuid.UUID]:
    return {m for (m,) in _sql("SELECT id FROM pgmb_message")}


def snapshot() -> tuple[dict[str, tuple], dict[int, tuple]]:
    """Every message and attempt in PostgreSQL, as the archive's rows read back."""
    messages = {
        str(row[0]): row[1:]
        for row in _sql(
            "SELECT id, routing_key, body::text, headers::text, "
            "(extract(epoch FROM created_at) * 1000000)::bigint, "
            "(extract(epoch FROM available_at) * 1000000)::bigint FROM pgmb_message"
        )
    }
    attempts = {
        row[0]: row[1:]
        for row in _sql(
            "SELECT a.id, a.message_id::text, a.queue_id::text, q.name, w.name, a.attempt, "
            "a.outcome, a.status_code, a.duration_ms, a.error, "
            "(extract(epoch FROM a.created_at) * 1000000)::bigint, "
            "(extract(epoch FROM m.created_at) * 1000000)::bigint "
            "FROM pgmb_attempt a JOIN pgmb_message m ON m.id = a.message_id "
            "LEFT JOIN pgmb_queue q ON q.id = a.queue_id "
            "LEFT JOIN pgmb_worker w ON w.id = q.worker_id"
        )
    }
    return messages, attempts


def _json(messages: dict[str, tuple]) -> dict[str, tuple]:
    """Bodies and headers parsed: equal JSON, whatever the spacing of its text."""
    return {k: (v[0], json.loads(v[1]), json.loads(v[2]), *v[3:]) for k, v in messages.items()}


@dataclass
class Archive:
    #: Rows of messages/ and attempts/ (ids may repeat if the archive duplicated any).
    message_rows: list[tuple]
    attempt_rows: list[tuple]
    #: Partition folders: (run, day) of messages, (run, day, queue) of attempts.
    message_partitions: set[tuple]
    attempt_partitions: set[tuple]

    @property
    def messages(self) -> dict[str, tuple]:
        return {row[0]: row[1:] for row in self.message_rows}

    @property
    def attempts(self) -> dict[int, tuple]:
        return {row[0]: row[1:] for row in self.attempt_rows}


def read_archive(root: Path) -> Archive:
    """Read the archive under ``root`` with Spark (local[1]; the session is stopped after)."""
    from pyspark.sql import functions as F

    from pgmb.pipeline.spark import session

    micros = F.unix_micros
    spark = session("test read", "local[1]", {}, None)
    try:
        message_rows: list[tuple] = []
        message_partitions: set[tuple] = set()
        if (root / "messages").exists():
            frame = spark.read.parquet(str(root / "messages"))
            for r in frame.select(
                "id",
                "routing_key",
                "body",
                "headers",
                micros("created_at"),
                micros("available_at"),
                "run",
                F.date_format("day", "yyyy-MM-dd"),
            ).collect():
                message_rows.append(tuple(r[:6]))
                message_partitions.add((r[6], r[7]))
        attempt_rows: list[tuple] = []
        attempt_partitions: set[tuple] = set()
        if (root / "attempts").exists() and list((root / "attempts").rglob("*.parquet")):
            frame = spark.read.parquet(str(root / "attempts"))
            for r in frame.select(
                "id",
                "message_id",
                "queue_id",
                "queue",
                "worker_name",
                "attempt",
                "outcome",
                "status_code",
                "duration_ms",
                "error",
                micros("created_at"),
                micros("published_at"),
                "run",
                F.date_format("day", "yyyy-MM-dd"),
            ).collect():
                attempt_rows.append(tuple(r[:12]))
                attempt_partitions.add((r[12], r[13], r[3]))
    finally:
        spark.stop()
    return Archive(message_rows, attempt_rows, message_partitions, attempt_partitions)


def assert_exactly_once(
    archive: Archive,
    before: tuple[dict[str, tuple], dict[int, tuple]],
    after: tuple[dict[str, tuple], dict[int, tuple]],
) -> None:
    """Every message and attempt of ``before`` is either in the archive, once and equal,
    or still in PostgreSQL (``after``): never lost, never twice."""
    messages, attempts = before
    left_messages, left_attempts = after
    ids = [row[0] for row in archive.message_rows]
    assert len(ids) == len(set(ids)), "a message archived twice"
    attempt_ids = [row[0] for row in archive.attempt_rows]
    assert len(attempt_ids) == len(set(attempt_ids)), "an attempt archived twice"
    assert not set(ids) & set(left_messages), "archived and still in PostgreSQL"
    assert not set(attempt_ids) & set(left_attempts), "archived and still in PostgreSQL"
    assert set(ids) | set(left_messages) >= set(messages), "a message lost"
    assert set(attempt_ids) | set(left_attempts) >= set(attempts), "an attempt lost"
    assert _json(archive.messages) == _json({k: messages[k] for k in ids})
    assert archive.attempts == {k: attempts[k] for k in attempt_ids}
