-- The results of Django tasks (pgmb.tasks): pgmb_task_result, one row per task message,
-- keyed by the message's id. Every statement that returns a result returns the columns of
-- pgmb.tasks.results.COLUMNS, in that order.

-- name: insert_result
-- Right after pgmb.publish.send, in the same transaction: the routing trigger has run, so
-- pgmb.unrouted() says whether some queue got the message.
INSERT INTO pgmb_task_result
    (id, backend, task_path, queue_name, priority, run_after, args, kwargs, status,
     enqueued_at, errors, worker_ids)
VALUES (%(id)s, %(backend)s, %(task_path)s, %(queue_name)s, %(priority)s, %(run_after)s,
        %(args)s::jsonb, %(kwargs)s::jsonb, 'READY', statement_timestamp(), '[]', '{}')
RETURNING enqueued_at, NOT EXISTS (SELECT 1 FROM pgmb.unrouted(ARRAY[id]))

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

-- name: start
-- A task that already succeeded is not run again (its message came back after the worker
-- recorded the outcome but before it acknowledged the message).
UPDATE pgmb_task_result
SET status = 'RUNNING',
    started_at = coalesce(started_at, statement_timestamp()),
    last_attempted_at = statement_timestamp(),
    worker_ids = worker_ids || %(worker_id)s::text
WHERE id = %(id)s AND status <> 'SUCCESSFUL'
RETURNING id, backend, task_path, queue_name, priority, run_after, args, kwargs, status,
          enqueued_at, started_at, last_attempted_at, finished_at, return_value, errors,
          worker_ids

-- name: status
SELECT status FROM pgmb_task_result WHERE id = %(id)s

-- name: succeed
UPDATE pgmb_task_result
SET status = 'SUCCESSFUL', return_value = %(return_value)s::jsonb,
    finished_at = statement_timestamp()
WHERE id = %(id)s
RETURNING finished_at

-- name: fail
-- final: no attempt is left (FAILED); otherwise the task waits for its next one (READY).
UPDATE pgmb_task_result
SET status = CASE WHEN %(final)s THEN 'FAILED' ELSE 'READY' END,
    errors = errors || jsonb_build_array(%(error)s::jsonb),
    finished_at = CASE WHEN %(final)s THEN statement_timestamp() END
WHERE id = %(id)s
RETURNING status, finished_at

-- name: max_attempts
-- How many reads the queue of a pull queue's message (a delivery) allows.
SELECT 1 + q.max_retries
FROM pgmb_delivery AS d
JOIN pgmb_queue AS q ON q.id = d.queue_id
WHERE d.id = %(delivery_id)s
