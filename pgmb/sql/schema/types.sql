-- Schema pgmb and the composite types its functions exchange. Django owns the pgmb_* tables
-- (pgmb/models.py); everything of pgmb's that Django does not declare lives in schema pgmb,
-- or, for the tables, in tables.sql.

CREATE SCHEMA IF NOT EXISTS pgmb;

-- What a claim hands a dispatcher: the delivery, its message, and where to post it.
-- max_attempts (1 + the queue's max_retries): a failure of that attempt dead-letters.
-- secrets: those that sign the request (pgmb.signing_secrets), current first; empty: unsigned.
CREATE TYPE pgmb.claimed AS (
    delivery_id bigint, lease_id uuid, attempt integer, max_attempts integer, queue_id uuid,
    queue text, message_id uuid, routing_key text, body text, headers jsonb,
    created_at timestamptz, worker_id uuid, endpoint text, timeout float8, secrets text[],
    rps integer, lease_seconds float8
);

-- What one POST produced. status NULL: no HTTP answer (error says why).
CREATE TYPE pgmb.http_outcome AS (status integer, error text, retry_after float8, duration_ms float8);

-- One row of pgmb.metrics(): a queue's figures at scrape_time.
CREATE TYPE pgmb.queue_metrics AS (
    queue_name text,
    queue_length bigint,          -- live deliveries: ready, delayed and leased
    queue_visible_length bigint,  -- ready and due now
    newest_msg_age_sec float8,    -- since the newest live delivery was published (NULL: none)
    oldest_msg_age_sec float8,    -- since the oldest due one was published (NULL: none due)
    total_messages bigint,        -- deliveries the queue ever had: live + dead + acked
    leased bigint,
    retrying bigint,              -- attempts > 0, not leased
    dead_letters bigint,
    delivered_last_hour bigint,   -- acknowledged attempts in the last hour
    failed_last_hour bigint,      -- failed attempts (retry, dead, expired) in the last hour
    paused boolean,
    scrape_time timestamptz
);

-- One row of pgmb.worker_metrics(): a worker's last hour (and last day of failures).
CREATE TYPE pgmb.worker_metrics AS (
    worker_name text,
    active boolean,
    requests_last_hour bigint,
    successes_last_hour bigint,
    success_rate float8,          -- successes / requests of the last hour (NULL: no request)
    p95_latency_ms float8,        -- over the last hour's attempts with a duration
    last_success_at timestamptz,
    last_error_status integer,
    last_error text,
    last_error_at timestamptz,    -- the newest failure of the last 24 hours
    consecutive_failures bigint,  -- failures since the last success, within 24 hours
    scrape_time timestamptz
);

-- What a read returns (PGMQ's message_record, plus pgmb's ids and routing key).
CREATE TYPE pgmb.pull_message AS (
    delivery_id bigint,   -- the handle: PGMQ's msg_id
    message_id uuid,
    read_ct integer,      -- the delivery's attempts
    enqueued_at timestamptz,
    vt timestamptz,
    body jsonb,
    headers jsonb,
    routing_key text
);
