"""Migration 0028 (routing tags): queues created before it route by their tags after it,
and migrating back routes by literal words again."""

from __future__ import annotations

import itertools

import psycopg
import pytest

from pgmb import routing
from tests.migrations.conftest import manage

BEFORE = "0027_pull_read_plans"
BINDINGS = ["order.*", "*.svc1.created", "#.svc1", "svc1.*.#", "#.created", "a.#.b", "#", "*"]
WORDS = ["order", "created", "svc1", "a", "b"]
KEYS = sorted({".".join(c) for n in (1, 2, 3) for c in itertools.product(WORDS, repeat=n)})


def _routed(conn: psycopg.Connection) -> set[tuple[str, str]]:
    """Publish every key in one statement; the (binding, key) pairs routed (then removed)."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO pgmb_message (routing_key, body) SELECT k, '1' FROM unnest(%s::text[]) k",
            (KEYS,),
        )
        rows = conn.execute(
            "SELECT q.binding_key, m.routing_key FROM pgmb_delivery d"
            " JOIN pgmb_queue q ON q.id = d.queue_id JOIN pgmb_message m ON m.id = d.message_id"
        ).fetchall()
        conn.execute("DELETE FROM pgmb_delivery")
        conn.execute("DELETE FROM pgmb_message")
    return set(rows)


def _deduplicated(conn: psycopg.Connection) -> tuple[int, int]:
    """pgmb.admit_message finds the queues of a key by the same filter: with a window on
    `*.svc1.created` only, a repeated dedup id is dropped for a key it matches, kept for one
    it does not (as (messages stored of the first, of the second))."""
    conn.execute("UPDATE pgmb_queue SET dedup_window = 0")
    conn.execute("UPDATE pgmb_queue SET dedup_window = 300 WHERE binding_key = '*.svc1.created'")
    stored = []
    for key in ("x.svc1.created", "svc1.x.created"):
        for _ in range(2):
            conn.execute(
                "SELECT pgmb.send(gen_random_uuid(), %s, '1', NULL, NULL::timestamptz,"
                " dedup_id => %s)",
                (key, key),
            )
        [(count,)] = conn.execute(
            "SELECT count(*) FROM pgmb_message WHERE routing_key = %s", (key,)
        ).fetchall()
        stored.append(count)
    conn.execute("DELETE FROM pgmb_delivery")
    conn.execute("DELETE FROM pgmb_message")
    return stored[0], stored[1]


def _columns(conn: psycopg.Connection) -> set[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'pgmb_queue'"
        " AND column_name IN ('literal_words', 'binding_tags')"
    ).fetchall()
    return {name for (name,) in rows}


@pytest.mark.django_db
def test_queues_from_before_route_by_their_tags_and_back(scratch):
    expected = {
        (b, k) for b in BINDINGS for k in KEYS if routing.matches(routing.compile_binding(b), k)
    }
    with scratch("pgmb_routing_tags") as info, psycopg.connect(**info, autocommit=True) as conn:
        manage(info["dbname"], "migrate", "pgmb", BEFORE, "--noinput", "-v", "0")
        [(worker,)] = conn.execute("SELECT pgmb.worker('w', 'http://127.0.0.1:9/', 1)").fetchall()
        for n, binding in enumerate(BINDINGS):
            conn.execute("SELECT pgmb.create(%s, %s, %s, 1)", (f"q{n}", binding, worker))
        assert _columns(conn) == {"literal_words"}
        assert _routed(conn) == expected
        assert _deduplicated(conn) == (1, 2)

        manage(info["dbname"], "migrate", "pgmb", "--noinput", "-v", "0")
        assert _columns(conn) == {"binding_tags"}
        # Backfilled for the queues that existed, as the queue's trigger fills new ones.
        assert conn.execute(
            "SELECT count(*) FROM pgmb_queue WHERE binding_tags = pgmb.binding_tags(binding_key)"
        ).fetchone() == (len(BINDINGS),)
        assert conn.execute(
            "SELECT binding_tags FROM pgmb_queue WHERE binding_key = '*.svc1.created'"
        ).fetchone() == (["2.svc1", "3.created"],)
        assert _routed(conn) == expected
        assert _deduplicated(conn) == (1, 2)

        manage(info["dbname"], "migrate", "pgmb", BEFORE, "--noinput", "-v", "0")
        assert _columns(conn) == {"literal_words"}
        assert conn.execute(
            "SELECT literal_words FROM pgmb_queue WHERE binding_key = '*.svc1.created'"
        ).fetchone() == (["svc1", "created"],)
        assert _routed(conn) == expected
        assert _deduplicated(conn) == (1, 2)
        manage(info["dbname"], "migrate", "pgmb", "--noinput", "-v", "0")
        assert _deduplicated(conn) == (1, 2)
