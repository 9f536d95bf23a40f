"""Every list page on big tables: a million messages, a million attempts, a backlog of
250,000 live deliveries and 20,000 dead letters, generated in SQL.

For each list with its default ordering and each of its filters and searches, the page
renders with the rows it should have, and each query it ran is explained and run again
with EXPLAIN ANALYZE: no sequential scan of pgmb_message, pgmb_attempt or pgmb_delivery
(the count included), and on the message lists a bounded number of those tables' rows
read. Rows, never timings (docs/benchmarks.md has the times, measured with this data:
set PGMB_LIST_TIMINGS to a file name and the test writes them there).

Slow (a minute or two, nearly all of it the inserts): ``-m "not slow"`` leaves it out.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from pgmb.admin.common import MESSAGE_WINDOW
from pgmb.admin.paginator import EXACT_BELOW
from pgmb.models import Queue, Worker

from .conftest import url

pytestmark = pytest.mark.slow

N = 1_000_000
BIG_TABLES = ("pgmb_message", "pgmb_attempt", "pgmb_delivery")
PAGE = 100
#: The most rows of the big tables a message-list page may read (a fifth of a table): the
#: windowed questions (MESSAGE_WINDOW) read a few tens of thousands per query (a frequent
#: key's search up to FEW_MATCHES plus its walk, twice: the count and the page); a full
#: scan, a million.
#: Between them, a rare outcome (1 % 'expired') may be found either by walking the time
#: index until a page is full (~10,000 rows) or through every failure in the partial index
#: pgmb_attempt_failed (~110,000): the planner picks one or the other by its statistics.
MOST_ROWS_READ = 200_000

# Queues by share of the rows: (name, worker, share in 1/100 of k % 100). Row k (a message
# number, or a derived one) goes to the first queue whose bound exceeds k % 100; 1 row in
# 20,000 goes to "tiny" instead; "empty" gets nothing.
QUEUES = [
    ("half", "main", 50),
    ("third", "second", 80),
    ("some", "second", 95),
    ("few", "small", 99),
    ("rare", "small", 100),
    ("tiny", "small", None),
    ("empty", "idle", None),
]
WORKERS = ("main", "second", "small", "idle")
#: The names' prefix in the tables (other modules' tests make workers and queues too).
PREFIX = "big_"


def queue_of(k: str) -> str:
    """SQL: the index (1-based, in QUEUES order) of row k's queue."""
    bounds = " ".join(
        f"WHEN {k} %% 100 < {bound} THEN {i + 1}"
        for i, (_, _, bound) in enumerate(QUEUES)
        if bound is not None
    )
    return f"CASE WHEN {k} %% 20000 = 7 THEN 6 {bounds} END"


def message_id(i: str) -> str:
    """SQL: message i's id, increasing with i (as UUIDv7 ids would): the indexes on message
    ids are filled in order, which is what keeps the generation fast."""
    return f"('00000000-0000-4000-8000-' || lpad(to_hex({i}), 12, '0'))::uuid"


def uuid_of(i: int) -> uuid.UUID:
    return uuid.UUID(f"00000000-0000-4000-8000-{i:012x}")


# Message i: published N - i seconds ago (i = N is the newest), with a key of four first
# words and 97 second words. Every 1000th matched no queue: nothing refers to it.
MESSAGES = f"""
INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at)
SELECT {message_id("i")},
       (ARRAY['order', 'invoice', 'user', 'payment'])[i %% 4 + 1] || '.' || (i %% 97) || '.done',
       jsonb_build_object('n', i), '{{}}', now() - (%(n)s - i) * interval '1 second',
       now() - (%(n)s - i) * interval '1 second'
FROM generate_series(1, %(n)s) AS i
"""
# Attempt i is message i's (message i - 1's second one when message i is unrouted): 90 %
# acknowledged, 6 % retried after a 503, 2 % dead after a 500, 1 % expired leases, 1 %
# timeouts. No 3xx or 4xx at all.
ATTEMPTS = f"""
INSERT INTO pgmb_attempt (message_id, queue_id, attempt, outcome, status_code, duration_ms,
                          error, created_at)
SELECT {message_id("i - (i %% 1000 = 0)::int")}, (%(queues)s::uuid[])[{queue_of("i")}],
       1 + (i %% 1000 = 0)::int,
       CASE WHEN i %% 100 < 90 THEN 'ack' WHEN i %% 100 < 96 THEN 'retry'
            WHEN i %% 100 < 98 THEN 'dead' WHEN i %% 100 < 99 THEN 'expired' ELSE 'retry' END,
       CASE WHEN i %% 100 < 90 THEN 200 WHEN i %% 100 < 96 THEN 503
            WHEN i %% 100 < 98 THEN 500 END,
       5 + i %% 50,
       CASE WHEN i %% 100 < 90 THEN '' WHEN i %% 100 < 98 THEN 'HTTP error'
            WHEN i %% 100 < 99 THEN 'lease expired' ELSE 'timeout' END,
       now() - (%(n)s - i) * interval '1 second' + interval '10 ms'
FROM generate_series(1, %(n)s) AS i
"""
# A backlog: one message in four (the "user" ones) still has its delivery, oldest first in
# id order. 1 in 100 of those leased, 1 in 5 delayed (retrying), the rest ready and due;
# leases and delays end hours from now, so they hold for the whole test.
DELIVERIES = f"""
INSERT INTO pgmb_delivery (message_id, queue_id, state, attempts, available_at, created_at,
                           lease_id, last_status, last_error)
SELECT {message_id("i")}, (%(queues)s::uuid[])[{queue_of("i / 4")}],
       CASE WHEN i %% 400 = 2 THEN 'leased' ELSE 'ready' END,
       CASE WHEN i %% 20 = 6 THEN 2 ELSE 0 END,
       CASE WHEN i %% 400 = 2 THEN now() + interval '1 hour'
            WHEN i %% 20 = 6 THEN now() + interval '2 hours' + i * interval '1 ms'
            ELSE now() - (%(n)s - i) * interval '1 second' END,
       now() - (%(n)s - i) * interval '1 second',
       CASE WHEN i %% 400 = 2 THEN gen_random_uuid() END,
       CASE WHEN i %% 20 = 6 THEN 503 END,
       CASE WHEN i %% 20 = 6 THEN 'HTTP 503' ELSE '' END
FROM generate_series(2, %(n)s, 4) AS i
"""
# The dead letters of the dead attempts (2 in 100 messages).
DEAD_LETTERS = f"""
INSERT INTO pgmb_dead_letter (message_id, queue_id, attempts, last_status, last_error,
                              created_at)
SELECT {message_id("i")}, (%(queues)s::uuid[])[{queue_of("i / 100")}], 6, 500, 'HTTP 500',
       now() - (%(n)s - i) * interval '1 second' + interval '20 ms'
FROM generate_series(1, %(n)s) AS i
WHERE i %% 100 IN (96, 97)
"""
TABLES = ("pgmb_message", "pgmb_attempt", "pgmb_delivery", "pgmb_dead_letter")


@dataclass
class Big:
    queues: dict[str, uuid.UUID]
    workers: dict[str, uuid.UUID]
    timings: list[str] = field(default_factory=list)


def _empty() -> None:
    """Leave the tables as every other test expects them: empty, statistics unknown.

    TRUNCATE gives the tables new, empty files (no dead rows, no bloated indexes to skew
    later tests' plans) and resets their row estimates; the column statistics of the
    million rows are forgotten as a fresh database has none.
    """
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(TABLES)}")
        cursor.execute(
            "DELETE FROM pg_statistic WHERE starelid = ANY(%s::regclass[])", [list(TABLES)]
        )
    # Through the ORM: the queues' trigger drops their SQL views.
    Queue.objects.filter(name__in=[PREFIX + name for name, _, _ in QUEUES]).delete()
    Worker.objects.filter(name__in=[PREFIX + name for name in WORKERS]).delete()


@pytest.fixture(scope="module")
def big(django_db_setup, django_db_blocker):
    """The big tables, committed (so they can be vacuumed, as autovacuum keeps real tables,
    and seen by every test of the module); emptied again afterwards."""
    with django_db_blocker.unblock():
        _empty()  # an interrupted run may have left them
        try:
            with transaction.atomic():
                workers = {
                    name: Worker.objects.create(name=PREFIX + name, endpoint="http://127.0.0.1:9/")
                    for name in WORKERS
                }
                # Bound to keys no message has: publishing routes nothing, the deliveries
                # below are the backlog.
                queues = {
                    name: Queue.objects.create(
                        name=PREFIX + name, binding_key=f"{name}.#", worker=workers[worker]
                    )
                    for name, worker, _ in QUEUES
                }
                ids = [str(queues[name].pk) for name, _, _ in QUEUES]
                with connection.cursor() as cursor:
                    for statement in (MESSAGES, ATTEMPTS, DELIVERIES, DEAD_LETTERS):
                        cursor.execute(statement, {"n": N, "queues": ids})
            with connection.cursor() as cursor:
                cursor.execute(f"VACUUM ANALYZE {', '.join(TABLES)}")
            state = Big(
                queues={name: q.pk for name, q in queues.items()},
                workers={name: w.pk for name, w in workers.items()},
            )
            yield state
            if path := os.environ.get("PGMB_LIST_TIMINGS"):
                with open(path, "w") as out:
                    out.write("\n".join(state.timings) + "\n")
        finally:
            _empty()


# The cases: (page, GET parameters, the condition on the page's table, in SQL, that the
# listed rows meet). In both, {queue:NAME} and {worker:NAME} stand for ids, {message:I}
# for message I's id.

TABLE = {
    "message": "pgmb_message",
    "delivery": "pgmb_delivery",
    "deadletter": "pgmb_dead_letter",
    "attempt": "pgmb_attempt",
    "queue": "pgmb_queue",
    "worker": "pgmb_worker",
}
TODAY = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
PAST_WEEK = {
    "created_at__gte": str(TODAY - timedelta(days=7)),
    "created_at__lt": str(TODAY + timedelta(days=1)),
}
IN_PAST_WEEK = "created_at >= %(week)s"
NEWEST_WITH_KEY = (
    "message_id IN (SELECT id FROM pgmb_message WHERE routing_key LIKE %(prefix)s"
    f" ORDER BY created_at DESC, id DESC LIMIT {MESSAGE_WINDOW})"
)
NOTHING_REFERS = (
    "NOT EXISTS (SELECT 1 FROM pgmb_delivery d WHERE d.message_id = t.id)"
    " AND NOT EXISTS (SELECT 1 FROM pgmb_dead_letter x WHERE x.message_id = t.id)"
    " AND NOT EXISTS (SELECT 1 FROM pgmb_attempt a WHERE a.message_id = t.id)"
)
UNROUTED = (
    "id IN (SELECT id FROM pgmb_message ORDER BY created_at DESC, id DESC"
    f" LIMIT {MESSAGE_WINDOW}) AND {NOTHING_REFERS}"
)


def of_worker(name: str) -> str:
    return f"queue_id IN (SELECT id FROM pgmb_queue WHERE worker_id = '{{worker:{name}}}')"


CASES: list[tuple[str, dict[str, str], str]] = [
    # Messages: newest first; routed; published in the past week; searched.
    ("message", {}, "true"),
    ("message", {"routed": "yes"}, f"NOT ({NOTHING_REFERS})"),
    ("message", {"routed": "no"}, UNROUTED),
    ("message", PAST_WEEK, IN_PAST_WEEK),
    ("message", {"q": "{message:123456}"}, "id = '{message:123456}'"),
    ("message", {"q": "invoice.5"}, "routing_key LIKE 'invoice.5%%'"),
    ("message", {"q": "user.17.done"}, "routing_key = 'user.17.done'"),
    ("message", {"q": "nothing.like.this"}, "false"),
    # Live deliveries: oldest first; by status, queue and worker; searched.
    ("delivery", {}, "true"),
    ("delivery", {"status": "ready"}, "available_at <= now()"),
    ("delivery", {"status": "delayed"}, "state = 'ready' AND available_at > now()"),
    ("delivery", {"status": "leased"}, "state = 'leased' AND available_at > now()"),
    ("delivery", {"queue__id__exact": "{queue:half}"}, "queue_id = '{queue:half}'"),
    ("delivery", {"queue__id__exact": "{queue:rare}"}, "queue_id = '{queue:rare}'"),
    ("delivery", {"queue__id__exact": "{queue:tiny}"}, "queue_id = '{queue:tiny}'"),
    ("delivery", {"queue__id__exact": "{queue:empty}"}, "false"),
    ("delivery", {"worker": "{worker:second}"}, of_worker("second")),
    ("delivery", {"worker": "{worker:small}"}, of_worker("small")),
    ("delivery", {"q": "{message:123458}"}, "message_id = '{message:123458}'"),
    ("delivery", {"q": "user.1"}, NEWEST_WITH_KEY),
    # Frequent among messages, absent from the backlog: what made a join read every row.
    ("delivery", {"q": "order."}, "false"),
    # Dead letters: newest first; by queue, worker, status; dead in the past week; searched.
    ("deadletter", {}, "true"),
    ("deadletter", {"queue__id__exact": "{queue:few}"}, "queue_id = '{queue:few}'"),
    ("deadletter", {"worker": "{worker:small}"}, of_worker("small")),
    ("deadletter", {"last_status_class": "5xx"}, "last_status BETWEEN 500 AND 599"),
    ("deadletter", PAST_WEEK, IN_PAST_WEEK),
    ("deadletter", {"q": "{message:123496}"}, "message_id = '{message:123496}'"),
    ("deadletter", {"q": "payment.4"}, NEWEST_WITH_KEY),
    # Attempts: newest first; by outcome, queue, worker, status class; past week; searched.
    ("attempt", {}, "true"),
    ("attempt", {"outcome__exact": "ack"}, "outcome = 'ack'"),
    ("attempt", {"outcome__exact": "dead"}, "outcome = 'dead'"),
    ("attempt", {"outcome__exact": "expired"}, "outcome = 'expired'"),
    ("attempt", {"queue__id__exact": "{queue:half}"}, "queue_id = '{queue:half}'"),
    ("attempt", {"queue__id__exact": "{queue:rare}"}, "queue_id = '{queue:rare}'"),
    ("attempt", {"queue__id__exact": "{queue:tiny}"}, "queue_id = '{queue:tiny}'"),
    ("attempt", {"queue__id__exact": "{queue:empty}"}, "false"),
    ("attempt", {"worker": "{worker:main}"}, of_worker("main")),
    ("attempt", {"worker": "{worker:small}"}, of_worker("small")),
    ("attempt", {"worker": "{worker:idle}"}, "false"),
    ("attempt", {"status_code_class": "2xx"}, "status_code BETWEEN 200 AND 299"),
    ("attempt", {"status_code_class": "5xx"}, "status_code >= 500 AND outcome <> 'ack'"),
    ("attempt", {"status_code_class": "4xx"}, "false"),
    ("attempt", {"status_code_class": "none"}, "status_code IS NULL AND outcome <> 'ack'"),
    ("attempt", PAST_WEEK, IN_PAST_WEEK),
    ("attempt", {"q": "{message:123457}"}, "message_id = '{message:123457}'"),
    # A key of 3 % of the messages (read through the key's index), and one of 25 % (found
    # by walking the time index).
    ("attempt", {"q": "order.1"}, NEWEST_WITH_KEY),
    ("attempt", {"q": "order."}, NEWEST_WITH_KEY),
    # Queues and workers: their figures (pgmb.metrics_all(), pgmb.worker_metrics()).
    ("queue", {}, "true"),
    ("worker", {}, "true"),
]
MESSAGE_LISTS = ("message", "delivery", "deadletter", "attempt")


def fill_in(text: str, big: Big) -> str:
    for name, pk in big.queues.items():
        text = text.replace(f"{{queue:{name}}}", str(pk))
    for name, pk in big.workers.items():
        text = text.replace(f"{{worker:{name}}}", str(pk))
    while "{message:" in text:
        start = text.index("{message:")
        end = text.index("}", start)
        text = text[:start] + str(uuid_of(int(text[start + 9 : end]))) + text[end + 1 :]
    return text


def case_id(case: tuple[str, dict[str, str], str]) -> str:
    page, params, _ = case
    return page + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")


def analyzed(statement: str, params: Any) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", params)
        (plan,) = cursor.fetchone()
    return (plan if isinstance(plan, list) else json.loads(plan))[0]


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found, todo = [], [plan["Plan"]]
    while todo:
        node = todo.pop()
        found.append(node)
        todo.extend(node.get("Plans", []))
    return found


def rows_read(node: dict[str, Any]) -> float:
    """Rows a scan node looked at: those it returned and those its conditions dropped."""
    per_loop = (
        node.get("Actual Rows", 0)
        + node.get("Rows Removed by Filter", 0)
        + node.get("Rows Removed by Index Recheck", 0)
    )
    return per_loop * node.get("Actual Loops", 1)


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_list_page_reads_through_indexes(big, admin_client, case):
    page, raw_params, oracle = case
    params = {k: fill_in(v, big) for k, v in raw_params.items()}
    # How many rows meet the condition, counted up to one more than EXACT_BELOW.
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM (SELECT FROM {TABLE[page]} t WHERE {fill_in(oracle, big)}"
            f" LIMIT {EXACT_BELOW + 1}) AS s",
            {"week": PAST_WEEK["created_at__gte"], "prefix": params.get("q", "") + "%"},
        )
        (expected,) = cursor.fetchone()
    admin_client.get(url(f"{page}_changelist"))  # warm up: the session, the user

    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(url(f"{page}_changelist"), params)

    assert response.status_code == 200
    cl = response.context["cl"]
    assert len(cl.result_list) == min(PAGE, expected)
    # Big lists show the planner's estimate; below EXACT_BELOW they count, exactly.
    assert cl.result_count == expected or cl.result_count >= EXACT_BELOW
    # The page's own queries (not the session's or the user's), the count included: the
    # table estimate (pg_class), the EXPLAIN of a filtered list (which reads no table), or
    # a COUNT(*) below EXACT_BELOW.
    statements = [
        q["sql"]
        for q in captured.captured_queries
        if not q["sql"].startswith("EXPLAIN") and ("pgmb_" in q["sql"] or "pgmb." in q["sql"])
    ]
    assert statements, "the page read nothing?"
    total_ms, read = 0.0, 0.0
    for statement in statements:
        # The captured text has its parameters filled in: run it as it is.
        plan = analyzed(statement, None)
        total_ms += plan["Execution Time"]
        for node in nodes(plan):
            table = node.get("Relation Name")
            if table not in BIG_TABLES:
                continue
            assert node["Node Type"] != "Seq Scan", (table, statement)
            read += rows_read(node)
    if page in MESSAGE_LISTS:
        assert read <= MOST_ROWS_READ, (read, statements)
    big.timings.append(f"{case_id(case)}\t{len(statements)}\t{read:.0f}\t{total_ms:.1f}")


def test_message_lists_are_in_their_index_order(big, admin_client):
    """The default orderings the indexes serve: the newest message, dead letter and
    attempt first, the oldest delivery first."""

    def first(page: str) -> Any:
        return admin_client.get(url(f"{page}_changelist")).context["cl"].result_list[0]

    assert first("message").pk == uuid_of(N)
    assert first("attempt").message_id == uuid_of(N - 1)  # N is unrouted: N - 1's 2nd
    assert first("deadletter").message_id == uuid_of(N - N % 100 - 3)  # i % 100 == 97
    assert first("delivery").message_id == uuid_of(2)
