-- What Django's models cannot declare portably: database defaults (so plain INSERTs from
-- any client work), CHECK constraints, and the index that keeps queue views unique.

ALTER TABLE pgmb_worker
    ALTER COLUMN id SET DEFAULT gen_random_uuid(),
    ALTER COLUMN timeout SET DEFAULT 10,
    ALTER COLUMN secret SET DEFAULT '',
    ALTER COLUMN active SET DEFAULT true,
    ALTER COLUMN created_at SET DEFAULT now(),
    ADD CONSTRAINT pgmb_worker_rps_positive CHECK (rps > 0),
    ADD CONSTRAINT pgmb_worker_timeout_positive CHECK (timeout > 0);

ALTER TABLE pgmb_queue
    ALTER COLUMN id SET DEFAULT gen_random_uuid(),
    ALTER COLUMN max_retries SET DEFAULT 5,
    ALTER COLUMN backoff_base SET DEFAULT 1,
    ALTER COLUMN backoff_max SET DEFAULT 300,
    ALTER COLUMN lease_seconds SET DEFAULT 60,
    ALTER COLUMN paused SET DEFAULT false,
    ALTER COLUMN created_at SET DEFAULT now(),
    ADD CONSTRAINT pgmb_queue_retries_not_negative CHECK (max_retries >= 0),
    ADD CONSTRAINT pgmb_queue_backoff_valid CHECK (backoff_base >= 0 AND backoff_max >= backoff_base),
    ADD CONSTRAINT pgmb_queue_lease_positive CHECK (lease_seconds > 0);

-- 'order' and 'order_queue' would both own the view pgmb.order_queue.
CREATE UNIQUE INDEX pgmb_queue_view_base ON pgmb_queue (pgmb.view_base(name));

ALTER TABLE pgmb_message
    ALTER COLUMN id SET DEFAULT gen_random_uuid(),
    ALTER COLUMN headers SET DEFAULT '{}',
    ALTER COLUMN created_at SET DEFAULT now(),
    ALTER COLUMN available_at SET DEFAULT now(),
    ADD CONSTRAINT pgmb_message_routing_key_valid
        CHECK (routing_key <> '' AND routing_key !~ '[*#[:space:][:cntrl:]]'),
    ADD CONSTRAINT pgmb_message_headers_object CHECK (jsonb_typeof(headers) = 'object');

ALTER TABLE pgmb_delivery
    ALTER COLUMN state SET DEFAULT 'ready',
    ALTER COLUMN attempts SET DEFAULT 0,
    ALTER COLUMN created_at SET DEFAULT now(),
    ADD CONSTRAINT pgmb_delivery_state_valid CHECK (state IN ('ready', 'leased'));

ALTER TABLE pgmb_dead_letter
    ALTER COLUMN last_error SET DEFAULT '',
    ALTER COLUMN created_at SET DEFAULT now();

ALTER TABLE pgmb_attempt
    ALTER COLUMN error SET DEFAULT '',
    ALTER COLUMN created_at SET DEFAULT now();
