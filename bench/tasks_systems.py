"""What bench/tasks.py's client process of one task system does, inside that system's Django
project (bench/tasks_settings.py): migrate, enqueue, and write its design limit.

:func:`serve` runs in a process of its own per system (Django is set up once per process,
and each system is a project of its own); bench/tasks.py calls the functions below in it.
Every function returns plain values (numbers, lists): they cross a pipe.

**Design limits.** For each system, copies of the tables it writes (``CREATE TABLE …
(LIKE … INCLUDING ALL)``: columns, defaults, CHECKs, indexes; no trigger, no foreign key)
get the rows the system writes per task, one statement per transaction, through the same
Django connection:

* pgmb: enqueue = its message, its delivery and its READY result (one INSERT … WITH);
  a run = claim (the oldest due delivery ``FOR UPDATE SKIP LOCKED`` gets its attempt and
  lease, its result turns RUNNING) then finish (the delivery deleted, its ``ack`` history
  row written, the result SUCCESSFUL).
* django-tasks-db: enqueue = its result row; a run = claim (the first READY row in its
  order, ``FOR UPDATE SKIP LOCKED``, turns RUNNING with the worker's id) then finish
  (SUCCESSFUL).
* procrastinate: enqueue = its job row and the ``deferred`` event its trigger writes; a
  run = claim (the first ``todo`` job, ``FOR UPDATE SKIP LOCKED``, turns ``doing``, event
  ``started``) then finish (``succeeded``, event ``succeeded``).
"""

from __future__ import annotations

import os
import time
import traceback
import uuid
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

BATCH = 100  # tasks per transaction of the bulk enqueue
QUEUE = "default"
LIMIT_PREFIX = "bench_limit_"

#: Per system: the tables the limit copies (original, copy).
LIMIT_TABLES = {
    "pgmb": {
        "pgmb_message": "bench_limit_message",
        "pgmb_delivery": "bench_limit_delivery",
        "pgmb_task_result": "bench_limit_result",
        "pgmb_attempt": "bench_limit_attempt",
    },
    "django_tasks_db": {"django_tasks_database_dbtaskresult": "bench_limit_result"},
    "procrastinate": {
        "procrastinate_jobs": "bench_limit_jobs",
        "procrastinate_events": "bench_limit_events",
    },
}

# --- The statements of the limits; %(n)s is a task's number (its argument), arrays for 100.

PGMB_ENQUEUE = """
WITH t AS (
    SELECT id, n FROM unnest(%(ids)s::uuid[], %(ns)s::integer[]) AS t(id, n)
), m AS (
    INSERT INTO bench_limit_message (id, routing_key, body, priority)
    SELECT id, 'tasks.default',
           '{"task": "bench.tasks_noop.noop", "backend": "default"}'::jsonb, 0
    FROM t
    RETURNING id, created_at, available_at, priority
), d AS (
    INSERT INTO bench_limit_delivery (message_id, queue_id, available_at, priority, created_at)
    SELECT id, %(queue_id)s, available_at, priority, created_at FROM m
)
INSERT INTO bench_limit_result
    (id, backend, task_path, queue_name, priority, run_after, args, kwargs, status, errors,
     worker_ids)
SELECT id, 'default', 'bench.tasks_noop.noop', 'default', 0, NULL, '[]',
       jsonb_build_object('n', n), 'READY', '[]', '{}'
FROM t
"""
PGMB_CLAIM = """
WITH picked AS (
    SELECT id FROM bench_limit_delivery
    WHERE queue_id = %(queue_id)s AND state = 'ready' AND available_at <= now()
    ORDER BY priority, available_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), d AS (
    UPDATE bench_limit_delivery d
    SET attempts = d.attempts + 1, available_at = now() + interval '60 seconds'
    FROM picked p WHERE d.id = p.id
    RETURNING d.id, d.message_id
)
UPDATE bench_limit_result r
SET status = 'RUNNING', started_at = coalesce(r.started_at, statement_timestamp()),
    last_attempted_at = statement_timestamp(), worker_ids = r.worker_ids || %(worker)s::text
FROM d JOIN bench_limit_message m ON m.id = d.message_id
WHERE r.id = d.message_id
RETURNING d.id, r.id, m.body, r.args, r.kwargs
"""
PGMB_FINISH = """
WITH gone AS (
    DELETE FROM bench_limit_delivery WHERE id = %(delivery_id)s
    RETURNING message_id, queue_id, attempts
), history AS (
    INSERT INTO bench_limit_attempt (message_id, queue_id, attempt, outcome, error, created_at)
    SELECT message_id, queue_id, attempts, 'ack', '', clock_timestamp() FROM gone
)
UPDATE bench_limit_result
SET status = 'SUCCESSFUL', return_value = 'null', finished_at = statement_timestamp()
WHERE id = %(id)s
"""
DTDB_ENQUEUE = """
INSERT INTO bench_limit_result
    (id, status, args_kwargs, priority, task_path, queue_name, backend_name, run_after,
     enqueued_at, return_value, exception_class_path, traceback, worker_ids)
SELECT id, 'READY', jsonb_build_object('args', '[]'::jsonb, 'kwargs', jsonb_build_object('n', n)),
       0, 'bench.tasks_noop.noop', 'default', 'default', '9999-01-01 00:00+00', now(), NULL,
       '', '', '[]'
FROM unnest(%(ids)s::uuid[], %(ns)s::integer[]) AS t(id, n)
"""
DTDB_CLAIM = """
UPDATE bench_limit_result
SET status = 'RUNNING', started_at = now(), worker_ids = worker_ids || to_jsonb(%(worker)s::text)
WHERE id = (
    SELECT id FROM bench_limit_result
    WHERE status = 'READY' AND (run_after = '9999-01-01 00:00+00' OR run_after <= now())
      AND backend_name = 'default' AND queue_name IN ('default')
    ORDER BY priority DESC, run_after, enqueued_at
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING id, id, args_kwargs
"""
DTDB_FINISH = """
UPDATE bench_limit_result
SET status = 'SUCCESSFUL', finished_at = now(), return_value = 'null',
    exception_class_path = '', traceback = ''
WHERE id = %(id)s
"""
PROCRASTINATE_ENQUEUE = """
WITH j AS (
    INSERT INTO bench_limit_jobs (queue_name, task_name, priority, lock, queueing_lock, args,
                                  scheduled_at)
    SELECT 'default', 'bench_noop', 0, NULL, NULL, jsonb_build_object('n', n), NULL
    FROM unnest(%(ns)s::integer[]) AS t(n)
    RETURNING id
)
INSERT INTO bench_limit_events (job_id, type) SELECT id, 'deferred' FROM j
"""
PROCRASTINATE_CLAIM = """
WITH j AS (
    UPDATE bench_limit_jobs
    SET status = 'doing', worker_id = 1
    WHERE id = (
        SELECT id FROM bench_limit_jobs
        WHERE status = 'todo' AND queue_name = ANY (ARRAY['default']::varchar[])
          AND (scheduled_at IS NULL OR scheduled_at <= now())
        ORDER BY priority DESC, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id, args
), e AS (
    INSERT INTO bench_limit_events (job_id, type) SELECT id, 'started' FROM j
)
SELECT id, id, args FROM j
"""
PROCRASTINATE_FINISH = """
WITH j AS (
    UPDATE bench_limit_jobs SET status = 'succeeded', attempts = attempts + 1
    WHERE id = %(id)s RETURNING id
)
INSERT INTO bench_limit_events (job_id, type) SELECT id, 'succeeded' FROM j
"""

#: (enqueue, claim, finish) per system.
LIMIT_SQL = {
    "pgmb": (PGMB_ENQUEUE, PGMB_CLAIM, PGMB_FINISH),
    "django_tasks_db": (DTDB_ENQUEUE, DTDB_CLAIM, DTDB_FINISH),
    "procrastinate": (PROCRASTINATE_ENQUEUE, PROCRASTINATE_CLAIM, PROCRASTINATE_FINISH),
}


def system() -> str:
    return os.environ["PGMB_BENCH_TASKS_SYSTEM"]


# --- Set-up. ---


def set_up() -> None:
    """Migrate (each system's tables from its own migrations), create pgmb's pull queue,
    and the limit's copies of the tables."""
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    if system() == "pgmb":
        from pgmb.tasks.worker import ensure_queues

        ensure_queues([QUEUE])
    with connection.cursor() as cursor:
        for original, copy in LIMIT_TABLES[system()].items():
            cursor.execute(f"CREATE TABLE {copy} (LIKE {original} INCLUDING ALL)")


def _queue_id() -> str | None:
    if system() != "pgmb":
        return None
    from pgmb.models import Queue

    return str(Queue.objects.get(name=f"tasks_{QUEUE}").id)


# --- Enqueueing through each system's own API. ---


def _enqueuer() -> Callable[[int], Any]:
    from bench import tasks_noop

    if system() == "procrastinate":
        return lambda n: tasks_noop.noop.defer(n=n)
    return lambda n: tasks_noop.noop.enqueue(n=n)


def enqueue(first: int, count: int) -> float:
    """Tasks ``first`` … ``first + count - 1``, one per transaction: the seconds it took."""
    from django.db import transaction

    put = _enqueuer()
    began = time.perf_counter()
    for n in range(first, first + count):
        with transaction.atomic():
            put(n)
    return time.perf_counter() - began


def enqueue_bulk(first: int, batches: int) -> float:
    """``batches`` transactions of :data:`BATCH` enqueues each: the seconds it took."""
    from django.db import transaction

    put = _enqueuer()
    began = time.perf_counter()
    for batch in range(batches):
        with transaction.atomic():
            for n in range(first + batch * BATCH, first + (batch + 1) * BATCH):
                put(n)
    return time.perf_counter() - began


def enqueue_paced(first: int, count: int, pause: float) -> list[float]:
    """One task per transaction, ``pause`` seconds apart: each one's commit time
    (``time.time()`` right after the commit returned)."""
    from django.db import transaction

    put = _enqueuer()
    committed = []
    for n in range(first, first + count):
        with transaction.atomic():
            put(n)
        committed.append(time.time())
        time.sleep(pause)
    return committed


# --- The design limit. ---


def limit_enqueue(first: int, count: int, per_statement: int) -> float:
    """The rows of ``count`` tasks, ``per_statement`` tasks a statement (and transaction):
    the seconds it took."""
    from django.db import connection

    statement = LIMIT_SQL[system()][0]
    queue_id = _queue_id()
    began = time.perf_counter()
    with connection.cursor() as cursor:
        for start in range(first, first + count, per_statement):
            ns = list(range(start, min(start + per_statement, first + count)))
            ids = [uuid.uuid4() for _ in ns]
            cursor.execute(statement, {"ids": ids, "ns": ns, "queue_id": queue_id})
    return time.perf_counter() - began


def limit_run() -> tuple[int, float]:
    """Claim and finish every task of the copies, one at a time: (tasks, seconds)."""
    from django.db import connection

    _, claim, finish = LIMIT_SQL[system()]
    params = {"queue_id": _queue_id(), "worker": f"bench:{os.getpid()}"}
    done = 0
    began = time.perf_counter()
    with connection.cursor() as cursor:
        while True:
            cursor.execute(claim, params)
            row = cursor.fetchone()
            if row is None:
                break
            cursor.execute(finish, {"delivery_id": row[0], "id": row[1]})
            done += 1
    return done, time.perf_counter() - began


# --- The process. ---


def serve(name: str, database: str, runs: str, pipe: Connection) -> None:
    """Set up Django for system ``name`` on ``database``, then run the calls ``pipe``
    brings, (function name, args), answering (ok, value or traceback)."""
    os.environ.update(
        PGMB_BENCH_TASKS_SYSTEM=name,
        PGMB_BENCH_DB=database,
        PGMB_BENCH_TASKS_RUNS=runs,
        DJANGO_SETTINGS_MODULE="bench.tasks_settings",
    )
    import django

    django.setup()
    while (call := pipe.recv()) is not None:
        function, args = call
        try:
            pipe.send((True, globals()[function](*args)))
        except Exception:
            pipe.send((False, traceback.format_exc()))
