-- The results of Django tasks (pgmb.tasks): pgmb_task_result, one row per task message,
-- keyed by the message's id. Every statement that returns a result returns the columns of
-- pgmb.tasks.results.COLUMNS, in that order.

-- name: enqueue
-- The task's message and its READY result, or nothing when no queue is bound to the key
-- (pgmb.enqueue_task, pgmb/sql/schema/tasks.sql): its enqueued_at, or NULL.
SELECT pgmb.enqueue_task(%(id)s, %(key)s, %(body)s::jsonb, %(message_priority)s, %(backend)s,
                         %(task_path)s, %(queue_name)s, %(priority)s, %(run_after)s::timestamptz,
                         %(args)s::jsonb, %(kwargs)s::jsonb, %(headers)s::jsonb)

-- name: get_result
-- A task whose message was dead-lettered without its worker recording the outcome (the
-- worker died during the last attempt) is FAILED since the dead letter's time.
SELECT r.id, r.backend, r.task_path, r.queue_name, r.priority, r.run_after, r.args, r.kwargs,
       CASE WHEN dead.at IS NULL THEN r.status ELSE 'FAILED' END,
       r.enqueued_at, r.started_at, r.last_attempted_at, coalesce(r.finished_at, dead.at),
       r.return_value, r.errors, r.worker_ids
FROM pgmb_task_result AS r
LEFT JOIN LATERAL (
    SELECT d.created_at AS at
    FROM pgmb_dead_letter AS d
    JOIN pgmb_queue AS q ON q.id = d.queue_id
    WHERE d.message_id = r.id AND q.binding_key = %(prefix)s || '.' || r.queue_name
    LIMIT 1
) AS dead ON r.status IN ('READY', 'RUNNING')
WHERE r.id = %(id)s

-- name: step
-- A worker's step between two tasks, one statement (one round trip, one transaction):
-- record the success of the task it ran (done_id; NULL: none), then mark the next task
-- (id; NULL: none) RUNNING and return it with the attempts its queue allows (delivery_id:
-- its message as read; NULL when unknown). The consumer deletes the messages of a batch
-- after it: a message that comes back meanwhile finds its result SUCCESSFUL, which the
-- UPDATE below skips, so a task that succeeded is not run again.
-- Columns: the finished_at of the success (NULL: none recorded), the attempts allowed,
-- then pgmb.tasks.results.COLUMNS of the started task (NULLs: none started).
WITH succeeded AS (
    UPDATE pgmb_task_result
    SET status = 'SUCCESSFUL', return_value = %(return_value)s::jsonb,
        finished_at = statement_timestamp()
    WHERE id = %(done_id)s
    RETURNING finished_at
), started AS (
    UPDATE pgmb_task_result
    SET status = 'RUNNING',
        started_at = coalesce(started_at, statement_timestamp()),
        last_attempted_at = statement_timestamp(),
        worker_ids = worker_ids || %(worker_id)s::text
    WHERE id = %(id)s AND status <> 'SUCCESSFUL'
    RETURNING id, backend, task_path, queue_name, priority, run_after, args, kwargs, status,
              enqueued_at, started_at, last_attempted_at, finished_at, return_value, errors,
              worker_ids
)
SELECT (SELECT finished_at FROM succeeded),
       (SELECT 1 + q.max_retries
        FROM pgmb_delivery AS d JOIN pgmb_queue AS q ON q.id = d.queue_id
        WHERE d.id = %(delivery_id)s::bigint),
       started.*
FROM (VALUES (1)) AS one LEFT JOIN started ON true

-- name: read_and_start
-- An idle worker's read (pgmb.read of the queue, as pgmb.pull.read_call) that also starts the
-- task of the first message read, as `step` does: one statement, one commit before the task
-- runs, where a read then a step were two. Columns: the read's (pgmb.pull.MESSAGE_COLUMNS),
-- the attempts the queue allows, then pgmb.tasks.results.COLUMNS of the started task on
-- the first row (NULLs: none started, and on every other row).
WITH got AS MATERIALIZED (
    SELECT r.*, row_number() OVER () AS place
    FROM pgmb.read(queue_name => %(queue)s, vt => %(vt)s::float8, qty => %(qty)s::integer,
                   filter => NULL) AS r
), started AS (
    UPDATE pgmb_task_result
    SET status = 'RUNNING',
        started_at = coalesce(started_at, statement_timestamp()),
        last_attempted_at = statement_timestamp(),
        worker_ids = worker_ids || %(worker_id)s::text
    WHERE id = (SELECT got.message_id FROM got WHERE got.place = 1) AND status <> 'SUCCESSFUL'
    RETURNING id, backend, task_path, queue_name, priority, run_after, args, kwargs, status,
              enqueued_at, started_at, last_attempted_at, finished_at, return_value, errors,
              worker_ids
)
SELECT got.delivery_id, got.message_id, got.read_ct, got.enqueued_at, got.vt, got.body,
       got.headers, got.routing_key,
       (SELECT 1 + q.max_retries FROM pgmb_queue AS q WHERE q.name = %(queue)s),
       started.*
FROM got LEFT JOIN started ON got.place = 1
ORDER BY got.place

-- name: status
SELECT status FROM pgmb_task_result WHERE id = %(id)s

-- name: fail
-- final: no attempt is left (FAILED); otherwise the task waits for its next one (READY).
UPDATE pgmb_task_result
SET status = CASE WHEN %(final)s THEN 'FAILED' ELSE 'READY' END,
    errors = errors || jsonb_build_array(%(error)s::jsonb),
    finished_at = CASE WHEN %(final)s THEN statement_timestamp() END
WHERE id = %(id)s
RETURNING status, finished_at
