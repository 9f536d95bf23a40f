"""Bloating pgmb_delivery's indexes for the housekeeping tests (a drained backlog)."""

from __future__ import annotations

from django.db import connection

from pgmb.housekeeping import Thresholds
from tests.waiting import wait_until

#: Small enough for a few thousand deliveries to exceed it.
SMALL = Thresholds(min_index_bytes=128 * 1024, bloat_factor=4.0)
#: Deliveries that make the primary key and the due index several times SMALL.
BACKLOG = 20_000


def index_sizes() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_relation_size(c.oid) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = 'pgmb_delivery'::regclass"
        )
        return dict(cursor.fetchall())


def live_rows() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_get_live_tuples('pgmb_delivery'::regclass)")
        return cursor.fetchone()[0]


def publish(count: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgmb_message (routing_key, body)"
            " SELECT 'order.created', '{}'::jsonb FROM generate_series(1, %s)",
            [count],
        )


def drained_backlog(count: int = BACKLOG) -> dict[str, int]:
    """Route ``count`` deliveries, delete them all, vacuum; the index sizes left."""
    publish(count)
    wait_until(lambda: live_rows() >= count, message="the statistics to count the backlog")
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pgmb_delivery")
        cursor.execute("VACUUM pgmb_delivery")
    wait_until(lambda: live_rows() == 0, message="the statistics to count the drain")
    return index_sizes()
