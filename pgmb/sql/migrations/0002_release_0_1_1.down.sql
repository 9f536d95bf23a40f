-- Reverse of 0002_release_0_1_1: puts back 0.1.0's objects that it changed, by concern in
-- the same order as the forward file.

-- ==== Delivery: routing keys, leases of the in-database loop ====


-- ==== Publishing: times, dedup scope, dependencies, reserved headers, limits ====


-- ==== Console: endpoints and secrets ====

-- The secrets that sign a worker's requests at time `at`, the one rule for every signing
-- path (the claim hands them to the external dispatcher and the in-database transports;
-- the admin's test request asks here): its secret `current` unless empty, then its retiring
-- secrets that have not expired, the most recently retired first. An empty array: the
-- requests are not signed.
CREATE OR REPLACE FUNCTION pgmb.signing_secrets(current text, worker_id uuid, at timestamptz)
RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT array_remove(ARRAY[current], '') || ARRAY(
        SELECT s.secret::text FROM pgmb_worker_secret s
        WHERE s.worker_id = signing_secrets.worker_id AND s.expires_at > at
        ORDER BY s.retired_at DESC, s.id DESC)
$$;

-- The worker trigger's part of rotation (models.Worker's worker_retire_secret, on an
-- UPDATE that changes the secret): the old secret, unless empty or broken (one stored
-- before the rule, which could not sign), retires for pgmb.secret_overlap(); a secret
-- that becomes current again stops retiring; the worker's expired ones are removed.
CREATE OR REPLACE FUNCTION pgmb.retire_secret(worker_id uuid, old_secret text, new_secret text)
RETURNS void
LANGUAGE sql AS $$
    DELETE FROM pgmb_worker_secret s
    WHERE s.worker_id = retire_secret.worker_id
      AND (s.secret = new_secret OR s.expires_at <= now());
    INSERT INTO pgmb_worker_secret (worker_id, secret, retired_at, expires_at)
    SELECT retire_secret.worker_id, old_secret, now(), now() + pgmb.secret_overlap()
    WHERE old_secret <> '' AND pgmb.secret_problem(old_secret) IS NULL
    ON CONFLICT (worker_id, secret)
    DO UPDATE SET retired_at = excluded.retired_at, expires_at = excluded.expires_at;
$$;

-- The BEFORE INSERT OR UPDATE trigger function of pgmb_worker: the name, endpoint, rate,
-- timeout and secret rules for every writer (an unchanged endpoint or secret stays
-- accepted), then the circuit breaker's settings (pgmb.check_breaker).
CREATE OR REPLACE FUNCTION pgmb.prepare_worker(w public.pgmb_worker) RETURNS public.pgmb_worker
    LANGUAGE plpgsql
    AS $_$
DECLARE
    problem text;
BEGIN
    PERFORM pgmb.check_name('worker', w.name);
    IF (w.endpoint IS NULL
        OR w.endpoint !~ '^[Hh][Tt][Tt][Pp][Ss]?://[^/?#\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]+(?:[/?#][^\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]*)?$')
       AND NOT EXISTS (SELECT 1 FROM pgmb_worker o WHERE o.id = w.id AND o.endpoint = w.endpoint) THEN
        RAISE EXCEPTION 'invalid endpoint % for worker %', quote_nullable(w.endpoint), w.name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The endpoint must be an http:// or https:// URL without blanks.';
    END IF;
    IF w.rps IS NULL OR w.rps <= 0 THEN
        RAISE EXCEPTION 'invalid rps % for worker %: it must be at least 1 request per second', w.rps, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.timeout IS NULL OR w.timeout <= 0 THEN
        RAISE EXCEPTION 'invalid timeout % for worker %: it must be positive', w.timeout, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    problem := pgmb.secret_problem(w.secret);
    IF problem IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM pgmb_worker o WHERE o.id = w.id AND o.secret = w.secret) THEN
        RAISE EXCEPTION 'invalid secret for worker %: %', w.name, problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use whsec_ and base64 (padded or not), or a text without control characters.';
    END IF;
    w := pgmb.check_breaker(w);
    RETURN w;
END $_$;

DROP FUNCTION pgmb.new_secret_problem(text);
DROP FUNCTION pgmb.max_retiring_secrets();

-- Whether the database's endpoint policy refuses address (the PL/Python transport asks
-- before it connects).
CREATE OR REPLACE FUNCTION pgmb.endpoint_refused(address inet) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT pgmb.endpoint_refused(address, p.allow, p.deny)
                     FROM pgmb.endpoint_policy AS p),
                    pgmb.endpoint_refused(address, '{}', '{169.254.0.0/16,fe80::/10}'))
$$;

-- Whether the database's endpoint policy is the default one. pgsql-http resolves, connects
-- and follows redirects inside libcurl, where no policy can be checked: it is used only
-- under the default policy (whose link-local refusal it cannot enforce either; the
-- documented gap of the default).
CREATE OR REPLACE FUNCTION pgmb.endpoint_policy_is_default() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT p.allow = '{}' AND p.deny = '{169.254.0.0/16,fe80::/10}'
                     FROM pgmb.endpoint_policy AS p), true)
$$;

UPDATE pgmb.endpoint_policy SET deny = '{169.254.0.0/16,fe80::/10}'
WHERE allow = '{}' AND deny = pgmb.default_endpoint_deny();
ALTER TABLE pgmb.endpoint_policy ALTER COLUMN deny SET DEFAULT '{169.254.0.0/16,fe80::/10}';
DROP FUNCTION pgmb.default_endpoint_deny();


-- ==== Installation and privileges ====

