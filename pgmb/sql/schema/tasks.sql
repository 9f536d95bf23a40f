-- Django Tasks (pgmb.tasks): what the backend's enqueue writes, in one call.

-- A task's message and its READY result, for pgmb.tasks.backend.PgmbBackend.enqueue: the
-- message as pgmb.publish.send writes it (the route_messages trigger delivers it at the
-- end of its INSERT; its headers: the enqueuer's trace context, or {}), the result with
-- the same id. Only when some queue is bound to the key, by the routing rule of
-- pgmb.admit_message and the trigger (the binding's tags, then its pattern); otherwise
-- nothing is written and the result is NULL, the caller's transaction still usable
-- (nothing was raised in it). Returns the result's enqueued_at.
-- A function rather than one statement sent as text: PL/pgSQL plans its statements once a
-- session, where the statement's text was planned at every call and the key's tags
-- computed there by running pgmb.key_tags, not inlined
-- (docs/decisions/0067-a-task-enqueued-by-one-function-call.md).
CREATE OR REPLACE FUNCTION pgmb.enqueue_task(
    id uuid, routing_key text, body jsonb, message_priority integer, backend text,
    task_path text, queue_name text, priority integer, run_after timestamptz, args jsonb,
    kwargs jsonb, headers jsonb
) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz;
BEGIN
    IF NOT EXISTS (SELECT FROM pgmb_queue AS q
                   WHERE q.binding_tags <@ pgmb.key_tags(enqueue_task.routing_key)
                     AND ('.' || enqueue_task.routing_key) ~ q.pattern) THEN
        RETURN NULL;
    END IF;
    INSERT INTO pgmb_message (id, routing_key, body, headers, created_at, available_at, priority)
    VALUES (enqueue_task.id, enqueue_task.routing_key, enqueue_task.body, enqueue_task.headers, now(),
            greatest(now(), coalesce(enqueue_task.run_after, now())),
            enqueue_task.message_priority);
    INSERT INTO pgmb_task_result AS r
        (id, backend, task_path, queue_name, priority, run_after, args, kwargs, status,
         enqueued_at, errors, worker_ids)
    VALUES (enqueue_task.id, enqueue_task.backend, enqueue_task.task_path,
            enqueue_task.queue_name, enqueue_task.priority, enqueue_task.run_after,
            enqueue_task.args, enqueue_task.kwargs, 'READY', statement_timestamp(), '[]', '{}')
    RETURNING r.enqueued_at INTO at;
    RETURN at;
END $$;

-- Its generic plan from the first call: a custom plan would compute the key's tags by
-- running pgmb.key_tags at planning, as the statement sent as text did.
ALTER FUNCTION pgmb.enqueue_task(uuid, text, jsonb, integer, text, text, text, integer,
                                 timestamptz, jsonb, jsonb, jsonb)
    SET plan_cache_mode = force_generic_plan;
