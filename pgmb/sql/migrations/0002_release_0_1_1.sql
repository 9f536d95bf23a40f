-- Migration 0002_release_0_1_1 (pgmb 0.1.1): what changed in pgmb/sql/schema/ since 0.1.0,
-- written by hand, by concern. Every object here is also in pgmb/sql/schema/, which stays
-- the source to read; tests/migrations proves both build the same catalog. 0.1.0's
-- dispatchers keep running while this applies: a function they call keeps its arguments
-- and result (a changed one gets a new name beside it; CONTRIBUTING.md, Migrations).

-- ==== Delivery: routing keys, leases of the in-database loop ====


-- ==== Publishing: times, dedup scope, dependencies, reserved headers, limits ====


-- ==== Console: endpoints and secrets ====

-- Workers' endpoints and secrets (docs/security.md): the endpoint rule of every writer (a
-- host, an IPv6 address in brackets, a port from 1 to 65535), the endpoint masked in the
-- trigger's error; a new secret's 16 bytes and at most 5 retiring secrets signing
-- (docs/decisions/0058-secret-length-and-retiring-bound.md). Stored rows are not checked
-- again: an unchanged endpoint or secret stays accepted, a short stored secret still signs.

-- What keeps a secret from being set as a worker's secret now (the worker trigger asks for a
-- changed one), or NULL: the secret rule (pgmb.secret_problem), then at least 16 bytes of
-- key (pgmb.worker_secrets.MIN_SECRET_BYTES, the same sentences; tests/rules). A shorter
-- secret stored before the rule still signs (pgmb.secret_key takes it) while it stays.
CREATE OR REPLACE FUNCTION pgmb.new_secret_problem(secret text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(pgmb.secret_problem(secret),
                    CASE WHEN secret <> '' AND octet_length(pgmb.secret_key(secret)) < 16
                         THEN 'a secret must hold at least 16 bytes (the base64 after ''whsec_'' decoded, or the text''s UTF-8 bytes)'
                    END)
$$;

-- The most retiring secrets that sign a worker's requests beside its current one
-- (pgmb.worker_secrets.MAX_RETIRING_SECRETS): each is one more signature a request, one
-- more HMAC on every path.
CREATE OR REPLACE FUNCTION pgmb.max_retiring_secrets() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 5
$$;

-- The secrets that sign a worker's requests at time `at`, the one rule for every signing
-- path (the claim hands them to the external dispatcher and the in-database transports;
-- the admin's test request asks here): its secret `current` unless empty, then its retiring
-- secrets that have not expired, the most recently retired first, at most
-- pgmb.max_retiring_secrets() of them (rows written past the bound, by a direct INSERT
-- say, sign nothing). An empty array: the requests are not signed.
CREATE OR REPLACE FUNCTION pgmb.signing_secrets(current text, worker_id uuid, at timestamptz)
RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT array_remove(ARRAY[current], '') || ARRAY(
        SELECT s.secret::text FROM pgmb_worker_secret s
        WHERE s.worker_id = signing_secrets.worker_id AND s.expires_at > at
        ORDER BY s.retired_at DESC, s.id DESC
        LIMIT pgmb.max_retiring_secrets())
$$;

-- The worker trigger's part of rotation (models.Worker's worker_retire_secret, on an
-- UPDATE that changes the secret): the old secret, unless empty or broken (one stored
-- before the rule, which could not sign), retires for pgmb.secret_overlap(); a secret
-- that becomes current again stops retiring; the worker's expired ones are removed, and
-- so are the oldest beyond pgmb.max_retiring_secrets() (300 rotations leave 5 retiring
-- secrets, not 300 signatures a request).
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
    DELETE FROM pgmb_worker_secret s
    WHERE s.worker_id = retire_secret.worker_id
      AND s.id NOT IN (SELECT k.id FROM pgmb_worker_secret k
                       WHERE k.worker_id = retire_secret.worker_id
                       ORDER BY k.retired_at DESC, k.id DESC
                       LIMIT pgmb.max_retiring_secrets());
$$;

-- The BEFORE INSERT OR UPDATE trigger function of pgmb_worker: the name, endpoint, rate,
-- timeout and secret rules for every writer (an unchanged endpoint or secret stays
-- accepted: a row stored before a rule can still be paused), then the circuit breaker's settings (pgmb.check_breaker).
CREATE OR REPLACE FUNCTION pgmb.prepare_worker(w public.pgmb_worker) RETURNS public.pgmb_worker
    LANGUAGE plpgsql
    AS $_$
DECLARE
    problem text;
BEGIN
    PERFORM pgmb.check_name('worker', w.name);
    IF (w.endpoint IS NULL
        OR w.endpoint !~ '^[Hh][Tt][Tt][Pp][Ss]?://(?:[^/?#\[\]\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]*@)?(?:\[[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\]|[^/?#@\[\]:\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]+)(?::(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])?)?(?:[/?#][^\u0000-\u0020\u007f-\u009f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]*)?$')
       AND NOT EXISTS (SELECT 1 FROM pgmb_worker o WHERE o.id = w.id AND o.endpoint = w.endpoint) THEN
        -- Named with its credentials masked: an error text reaches logs and screens.
        RAISE EXCEPTION 'invalid endpoint % for worker %', quote_nullable(pgmb.mask_credentials(w.endpoint)), w.name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The endpoint must be an http:// or https:// URL without blanks, its host a name, an IPv4 address or an IPv6 address in brackets, its port (if any) from 1 to 65535.';
    END IF;
    IF w.rps IS NULL OR w.rps <= 0 THEN
        RAISE EXCEPTION 'invalid rps % for worker %: it must be at least 1 request per second', w.rps, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.timeout IS NULL OR w.timeout <= 0 THEN
        RAISE EXCEPTION 'invalid timeout % for worker %: it must be positive', w.timeout, w.name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    problem := pgmb.new_secret_problem(w.secret);
    IF problem IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM pgmb_worker o WHERE o.id = w.id AND o.secret = w.secret) THEN
        RAISE EXCEPTION 'invalid secret for worker %: %', w.name, problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use whsec_ and the base64 of at least 16 bytes (padded or not), or a text of at least 16 bytes without control characters.';
    END IF;
    w := pgmb.check_breaker(w);
    RETURN w;
END $_$;

-- The default endpoint policy's networks (docs/decisions/0059-endpoint-presets.md).

-- The networks the default endpoint policy refuses: pgmb.conf.DEFAULT_ENDPOINT_POLICY's
-- deny list (link-local, the metadata services, also through NAT64 and 6to4; one table of
-- cases compares them, tests/rules/test_endpoint_presets.py).
CREATE OR REPLACE FUNCTION pgmb.default_endpoint_deny() RETURNS cidr[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '{169.254.0.0/16,fe80::/10,fd00:ec2::254/128,100.100.100.200/32,64:ff9b::a9fe:0/112,64:ff9b::6464:64c8/128,2002:a9fe::/32,2002:6464:64c8::/48}'::cidr[]
$$;

ALTER TABLE pgmb.endpoint_policy ALTER COLUMN deny SET DEFAULT pgmb.default_endpoint_deny();
-- A database on 0.1.0's default policy moves to 0.1.1's default (what migrate writes from
-- the settings next anyway), so that it is still recognised as the default meanwhile.
UPDATE pgmb.endpoint_policy SET deny = pgmb.default_endpoint_deny()
WHERE allow = '{}' AND deny = '{169.254.0.0/16,fe80::/10}';

-- Whether the database's endpoint policy refuses address (the PL/Python transport asks
-- before it connects).
CREATE OR REPLACE FUNCTION pgmb.endpoint_refused(address inet) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT pgmb.endpoint_refused(address, p.allow, p.deny)
                     FROM pgmb.endpoint_policy AS p),
                    pgmb.endpoint_refused(address, '{}', pgmb.default_endpoint_deny()))
$$;

-- Whether the database's endpoint policy is the default one. pgsql-http resolves, connects
-- and follows redirects inside libcurl, where no policy can be checked: it is used only
-- under the default policy (whose link-local refusal it cannot enforce either; the
-- documented gap of the default).
CREATE OR REPLACE FUNCTION pgmb.endpoint_policy_is_default() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT p.allow = '{}' AND p.deny = pgmb.default_endpoint_deny()
                     FROM pgmb.endpoint_policy AS p), true)
$$;

-- Closed by default, as every function of pgmb's not in access.sql's reviewed list.
REVOKE EXECUTE ON FUNCTION pgmb.new_secret_problem(text), pgmb.max_retiring_secrets(),
    pgmb.default_endpoint_deny() FROM PUBLIC;


-- ==== Installation and privileges ====

