"""One rule, one source: every rule pgmb checks both in Python and in SQL gives the same
verdict on both sides.

Each rule has ONE table of inputs. Every input goes through the Python function and the
SQL function; the test requires the same verdict (accepted or refused) and, where the
rule yields a value, equal values (Retry-After dates within a second, as the two sides read
the clock at different moments). The rules themselves are written in words next to their
Python implementation: pgmb/routing.py (keys, names), pgmb/models.py (endpoints),
pgmb/worker_request.py (secrets), pgmb/durations.py (delays), pgmb/dispatch/client.py
(Retry-After). NUL (U+0000) is in the key and secret classes but cannot be sent to
PostgreSQL in a text at all, so the tables do not hold it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import unicodedata
import uuid
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from django.core.exceptions import ValidationError
from django.db import connection, transaction

import pgmb
from pgmb import deliveries, durations, models, routing, worker_secrets
from pgmb import worker_request as request
from pgmb.dispatch import client
from pgmb.errors import InvalidDelay

pytestmark = pytest.mark.django_db

INVALID_VALUE = "22023"
INVALID_NAME = "42602"

Verdict = tuple[bool, Any]  # (True, value) or (False, what refused it)


def python(check, *args) -> Verdict:
    try:
        return True, check(*args)
    except (ValueError, ValidationError) as exc:
        return False, exc


def sql(statement: str, params: tuple, sqlstate: str = INVALID_VALUE) -> Verdict:
    """Run one statement in a savepoint: (True, first column) or (False, the error).

    A refusal must carry ``sqlstate``: any other database error fails the test.
    """
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement, params)
            return True, cursor.fetchone()[0]
    except Exception as exc:
        cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
        if not isinstance(cause, psycopg.Error) or cause.sqlstate != sqlstate:
            raise
        return False, cause


def same_verdict(py: Verdict, db: Verdict, value: object) -> None:
    assert py[0] == db[0], (
        f"{value!r}: Python {'accepts' if py[0] else 'refuses'} ({py[1]!r}), "
        f"SQL {'accepts' if db[0] else 'refuses'} ({db[1]!r})"
    )


def execute(statement: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement)


def rows(statement: str) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement)
        return cursor.fetchall()


def function_source(signature: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_functiondef(%s::regprocedure)", (signature,))
        return cursor.fetchone()[0]


# ---- keys ---------------------------------------------------------------------------

# (routing key, accepted?)
ROUTING_KEYS = [
    ("order.created", True),
    ("a", True),
    ("ordér.créé", True),
    ("🐇.hop", True),
    ("a..b", True),
    ("a\u200bb", True),  # zero-width space: a format character, not a blank
    ("a\u00adb", True),  # soft hyphen, likewise
    ("x" * 255, True),
    ("é" * 255, True),  # characters, not bytes
    ("x" * 256, False),
    ("", False),
    ("a b", False),
    ("a\tb", False),
    ("a\nb", False),
    ("a\n", False),
    ("a\rb", False),
    ("a\x01b", False),
    ("a\x1fb", False),
    ("a\x7fb", False),
    ("a\x80b", False),
    ("a\x85b", False),
    ("a\x9fb", False),
    ("a\u00a0b", False),
    ("a\u1680b", False),
    ("a\u2000b", False),
    ("a\u2007b", False),
    ("a\u200ab", False),
    ("a\u2028b", False),
    ("a\u2029b", False),
    ("a\u202fb", False),
    ("a\u205fb", False),
    ("a\u3000b", False),
    ("a\ufeffb", False),
    ("order.*", False),
    ("#", False),
    ("a#b", False),
]


@pytest.mark.parametrize(("key", "accepted"), ROUTING_KEYS)
def test_routing_keys(key, accepted):
    py = python(routing.validate_routing_key, key)
    db = sql("SELECT pgmb.check_routing_key(%s)", (key,))
    same_verdict(py, db, key)
    assert py[0] is accepted
    if accepted:
        assert db[1] == key
    # The message CHECK calls pgmb.valid_routing_key(): the same verdict, as a boolean.
    assert sql("SELECT pgmb.valid_routing_key(%s)", (key,)) == (True, accepted)


# (binding key, accepted?)
BINDING_KEYS = [
    ("order.*", True),
    ("#", True),
    ("*.created.#", True),
    ("a+b", True),
    ("[x]", True),
    ("a\\b", True),
    ("🐇.*", True),
    ("*" + ".x" * 127, True),  # 255 characters
    ("*" + ".x" * 127 + "y", False),  # 256
    ("", False),
    ("a*", False),
    ("a.#b", False),
    ("a. *", False),
    ("a\u00a0.*", False),
    ("a.\u2028", False),
    ("\ufeff#", False),
    ("a\t.#", False),
]


@pytest.mark.parametrize(("key", "accepted"), BINDING_KEYS)
def test_binding_keys(key, accepted):
    py = python(routing.compile_binding, key)
    db = sql("SELECT pgmb.compile_binding(%s)", (key,))
    same_verdict(py, db, key)
    assert py[0] is accepted
    if accepted:
        assert py[1] == db[1]  # the same compiled pattern


# (kind, name, accepted?)
NAMES = [
    ("worker", "orders", True),
    ("worker", "o", True),
    ("worker", "x" * 48, True),
    ("worker", "x" * 49, False),
    ("worker", "Orders", False),
    ("worker", "1orders", False),
    ("worker", "_orders", False),
    ("worker", "order-queue", False),
    ("worker", "ordér", False),
    ("worker", "orders\n", False),
    ("worker", "orders ", False),
    ("worker", "", False),
    ("worker", "orders_dead_letter", True),  # only queues own views
    ("queue", "orders", True),
    ("queue", "orders_queue", True),
    ("queue", "orders_dead_letter", False),
    ("queue", "orders_dead_letter_queue", False),
    ("queue", "q" * 45, True),
    ("queue", "q" * 46, False),
    ("queue", "q" * 42 + "_queue", True),  # the base has 42 characters
    ("queue", "x" * 48, False),
]


@pytest.mark.parametrize(("kind", "name", "accepted"), NAMES)
def test_names(kind, name, accepted):
    py = python(routing.validate_name, name, kind)
    db = sql("SELECT pgmb.check_name(%s, %s)", (kind, name), INVALID_NAME)
    same_verdict(py, db, name)
    assert py[0] is accepted


def test_the_key_class_is_written_out_identically():
    forbidden = routing.KEY_FORBIDDEN
    assert forbidden in function_source("pgmb.valid_key(text)")
    assert ("^" + routing.NAME_RE.pattern + "$") in function_source("pgmb.check_name(text, text)")
    # Keys written to pgmb_message are held to the same function (pgmb/sql/queries/triggers.sql:
    # by the routing trigger on INSERT, by check_routing_key_update on UPDATE).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.prosrc, t.tgname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
            " WHERE t.tgrelid = 'pgmb_message'::regclass AND t.tgname ~ 'route_messages'"
        )
        source, _ = cursor.fetchone()
        assert "WHERE NOT (pgmb.valid_routing_key(m.routing_key) AND" in source
        cursor.execute(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger"
            " WHERE tgrelid = 'pgmb_message'::regclass AND tgname ~ 'check_routing_key_update'"
        )
        assert "NOT pgmb.valid_routing_key((new.routing_key)::text)" in cursor.fetchone()[0]
    # It holds every character str.isspace() knows and every control character, U+FEFF,
    # and nothing else.
    expected = {
        chr(c)
        for c in range(0x110000)
        if chr(c).isspace() or unicodedata.category(chr(c)) == "Cc" or c in (0x20, 0xFEFF)
    }
    matched = {chr(c) for c in range(0x110000) if routing._FORBIDDEN.fullmatch(chr(c))}
    assert matched == expected


def test_the_server_reads_the_class_escapes_as_python_does():
    # \uHHHH inside brackets means one code point in both regex dialects: every character
    # around the class's edges gets the same verdict from both.
    edges = sorted(
        {
            c + d
            for c in (0x00, 0x20, 0x7F, 0x9F, 0xA0, 0x1680, 0x2000, 0x200A)
            for c in (c, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF)
            for d in (-1, 0, 1)
            if c + d > 0
        }
    )
    texts = [chr(c) for c in edges]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT array_agg(t ~ %s ORDER BY n)"
            " FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, n)",
            (routing.KEY_FORBIDDEN, texts),
        )
        in_sql = cursor.fetchone()[0]
    assert in_sql == [routing._FORBIDDEN.search(t) is not None for t in texts]


# ---- endpoints ----------------------------------------------------------------------

# (endpoint, accepted?)
ENDPOINTS = [
    ("http://a", True),
    ("https://orders.example.com/hook?x=1#frag", True),
    ("HTTP://A/", True),
    ("HtTpS://a.example.com", True),
    ("http://web:8000/", True),
    ("http://[::1]:8000/x", True),
    # Issue 26, item 15: a host urllib can split, a port a connection can be made to.
    ("http://[::1", False),
    ("http://[::1/x", False),
    ("http://u:p@[::1/x", False),
    ("http://[zz]/", False),
    ("http://[]/", False),
    ("http://a]/", False),
    ("http://a[b@h/", False),
    ("http://u:p@[::ffff:127.0.0.1]:1/", True),
    ("http://a:99999/", False),
    ("http://a:65536/", False),
    ("http://a:0/", False),
    ("http://a:080/", False),  # no leading zeros
    ("http://a:8o/", False),
    ("http://a:1:2/", False),
    ("http://a:1/", True),
    ("http://a:65535/", True),
    ("http://a:/", True),  # an empty port is the scheme's
    ("http://u:p@h:8443/", True),
    ("http://a@b@h/", True),  # the last "@" ends the credentials, as urllib reads them
    ("http://u:p@/x", False),  # credentials and no host
    ("http://:80/", False),
    ("https://ドメイン.example:8443/パス", True),
    ("http://a/ünïcode", True),
    ("http://a?q", True),
    ("ftp://a/", False),
    ("http://", False),
    ("http:///x", False),
    ("http://?x", False),
    ("http:/a", False),
    ("a.example.com/hook", False),
    ("javascript:alert(1)", False),
    (" http://a", False),
    ("http://a ", False),
    ("http://exa mple.com/", False),
    ("http://a/\u00a0", False),
    ("http://a\u00a0b/", False),
    ("http://a/\u2028", False),
    ("http://a/\ufeff", False),
    ("http://a/\x01", False),
    ("http://a/\x85", False),
    ("http://a\n", False),
    ("http://a/\t", False),
    ("http\u017f://a", False),  # Python's IGNORECASE alone takes U+017F (long s) for s
    ("", False),
]


@pytest.mark.parametrize(("endpoint", "accepted"), ENDPOINTS)
def test_endpoints(endpoint, accepted):
    py = python(models.validate_endpoint, endpoint)
    db = sql(
        "INSERT INTO pgmb_worker (name, endpoint, rps) VALUES ('endpoint_rule', %s, 1)"
        " RETURNING endpoint",
        (endpoint,),
    )
    same_verdict(py, db, endpoint)
    assert py[0] is accepted
    if accepted:  # what the rule takes, urllib splits, and a connection can be made to
        parts = urlsplit(endpoint)
        assert parts.hostname and parts.port in (None, *range(1, 65536))


def test_the_endpoint_regex_is_written_out_identically():
    assert models.ENDPOINT_PATTERN in function_source("pgmb.prepare_worker(pgmb_worker)")


# ---- a queue's durations ----------------------------------------------------------------

# (field, value, accepted?): a lease and a backoff are finite and at most 30 days.
DURATIONS = [
    (field, value, accepted)
    for field in ("lease_seconds", "backoff_base", "backoff_max")
    for value, accepted in [
        (60.0, True),
        (float(models.MAX_QUEUE_SECONDS), True),
        (models.MAX_QUEUE_SECONDS + 0.5, False),
        (1e300, False),
        (float("inf"), False),
        (float("nan"), False),
    ]
] + [
    ("lease_seconds", 0.001, True),
    ("lease_seconds", 0.0, False),
    ("backoff_base", 0.0, True),
    ("backoff_base", -1.0, False),
]


@pytest.mark.parametrize(("field", "value", "accepted"), DURATIONS)
def test_queue_durations(field, value, accepted, make_worker):
    worker = make_worker(timeout=0.0005)  # shorter than every lease here
    py = python(models.Queue._meta.get_field(field).run_validators, value)
    # The other durations are chosen so that only `field` can break the rule.
    row = {"lease_seconds": 60.0, "backoff_base": 0.0, "backoff_max": models.MAX_QUEUE_SECONDS}
    row[field] = value
    if field == "backoff_base" and accepted:
        row["backoff_max"] = max(value, 0.0)
    db = sql(
        "INSERT INTO pgmb_queue (name, binding_key, pattern, worker_id, lease_seconds,"
        " backoff_base, backoff_max) VALUES ('duration_rule', '#', '', %s, %s, %s, %s)"
        " RETURNING " + field,
        (worker.pk, row["lease_seconds"], row["backoff_base"], row["backoff_max"]),
    )
    same_verdict(py, db, (field, value))
    assert py[0] is accepted


def test_durations_stored_before_the_rule_neither_stop_claims_nor_retries(make_queue):
    """Rows from before 0004 may hold any duration: claim and retry clamp them."""
    queue = make_queue("#", max_retries=1)
    execute("SET CONSTRAINTS ALL IMMEDIATE")  # Django's deferred FKs would block the ALTER
    execute("ALTER TABLE pgmb_queue DROP CONSTRAINT pgmb_queue_durations_bounded")
    execute("SET session_replication_role = replica")
    execute(
        "UPDATE pgmb_queue SET lease_seconds = 1e300, backoff_base = 1e300, backoff_max = 1e300"
    )
    execute("SET session_replication_role = DEFAULT")
    pgmb.send("k", 1)
    [claim] = deliveries.claim()
    [(lease_days,)] = rows(
        "SELECT extract(epoch FROM available_at - now()) / 86400 FROM pgmb_delivery"
    )
    assert 29.9 < lease_days < 30.01  # from now(), the start of the test's transaction
    assert deliveries.fail([deliveries.Failure(claim.delivery_id, claim.lease_id, 500)]) == 1
    [(retry_days,)] = rows(
        "SELECT extract(epoch FROM available_at - now()) / 86400 FROM pgmb_delivery"
    )
    assert 14.9 < retry_days < 30.01  # equal jitter within [d/2, d], d capped at 30 days
    assert queue.deliveries.get().state == "ready"


# ---- secrets ------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# (secret, accepted?)
SECRETS = [
    ("", True),  # unsigned
    ("whsec_" + b64(b"k" * 16), True),  # padded (==)
    ("whsec_" + b64(b"k" * 16).rstrip("="), True),  # the same, unpadded
    ("whsec_" + b64(b"k" * 17), True),  # padded (=)
    ("whsec_" + b64(b"k" * 17).rstrip("="), True),
    ("whsec_" + b64(b"k" * 24), True),  # no padding needed
    ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", True),  # Standard Webhooks' example
    ("whsec_" + b64(bytes(range(256))[-120:]), True),  # + and / in it
    ("whsec_" + b64(b"k" * 15), True),  # usable; too short for a new secret
    ("a" * 15, True),
    ("a" * 16, True),
    ("é" * 8, True),  # 16 bytes of UTF-8
    ("é" * 7 + "a", True),  # 15 bytes
    ("whsec_YQ", True),
    ("whsec_YQ=", True),
    ("whsec_YQ==", True),
    ("whsec_YR", True),  # trailing bits not zero: decoded as the libraries do
    ("whsec_dG9wc2VjcmV0", True),
    ("whsec_YQ===", False),  # three '='
    ("whsec_a", False),  # 1 mod 4
    ("whsec_aaaaa", False),
    ("whsec_a==", False),
    ("whsec_topsecret", False),  # 9 characters
    ("whsec_", False),  # no bytes
    ("whsec_==", False),
    ("whsec_ab-_cd", False),  # url-safe alphabet
    ("whsec_ab-_", False),
    ("whsec_ab cd", False),
    ("whsec_ab=cd", False),
    ("whsec_abc\n", False),
    ("whsec_YWJj\u00a0", False),
    ("plain secret", True),  # raw: its UTF-8 bytes
    ("s3cret", True),
    ("pässwörd", True),
    ("🔑", True),
    (" leading and trailing ", True),
    ("WHSEC_abc", True),  # not the prefix: a raw secret
    ("whsec", True),
    ("line\u2028separator", True),  # not a control character
    ("tab\tsecret", False),
    ("new\nline", False),
    ("\x01", False),
    ("del\x7f", False),
    ("c1\x85", False),
    ("c1\x9f", False),
]


def standard_webhooks_key(secret: str) -> bytes:
    """The key Standard Webhooks' reference verifier (PyPI standardwebhooks 1.1) uses."""
    if secret.startswith("whsec_"):
        return base64.b64decode(secret[len("whsec_") :] + "==")
    return secret.encode()


@pytest.mark.parametrize(("secret", "accepted"), SECRETS)
def test_secrets(secret, accepted):
    """``accepted``: the secret can sign (pgmb.secret_key). A new secret must also hold
    MIN_SECRET_BYTES bytes of key (pgmb.new_secret_problem, the worker trigger)."""
    py = python(request.secret_key, secret)
    db = sql("SELECT pgmb.secret_key(%s)", (secret,))
    same_verdict(py, db, secret)
    assert py[0] is accepted
    # Setting it: the model's validator and the worker trigger give one verdict.
    new = python(models.validate_secret, secret)
    stored = sql(
        "INSERT INTO pgmb_worker (name, endpoint, rps, secret)"
        " VALUES ('secret_rule', 'http://a/', 1, %s) RETURNING secret",
        (secret,),
    )
    same_verdict(new, stored, secret)
    long_enough = not accepted or secret == "" or len(py[1]) >= worker_secrets.MIN_SECRET_BYTES
    assert new[0] is (accepted and long_enough)
    if accepted and not long_enough:
        assert "at least 16 bytes" in str(stored[1])
        assert len(secret) <= len("whsec_") or secret not in str(stored[1])  # never quoted
    if not accepted:
        assert "invalid worker secret" in str(db[1])
        assert len(secret) <= len("whsec_") or secret not in str(db[1])  # never quoted
        return
    key = request.secret_key(secret)
    assert bytes(db[1]) == key
    assert key == standard_webhooks_key(secret)
    if secret:
        # The signature Python sends is the one pgmb.request_headers() sends.
        message_id, timestamp, body = str(uuid.uuid4()), 1_700_000_000, '{"a": "é"}'
        ok, signature = sql(
            "SELECT pgmb.request_headers(ROW(1, gen_random_uuid(), 1, 1, gen_random_uuid(), 'q',"
            " %s::uuid, 'k', %s, '{}'::jsonb, now(), gen_random_uuid(), 'http://a/', 1,"
            " ARRAY[%s], 1,"
            " 60)::pgmb.claimed, %s) ->> 'webhook-signature'",
            (message_id, body, secret, timestamp),
        )
        assert ok
        assert signature == request.signature(secret, message_id, timestamp, body.encode())
        expected = hmac.new(
            standard_webhooks_key(secret),
            f"{message_id}.{timestamp}.{body}".encode(),
            hashlib.sha256,
        ).digest()
        assert signature == "v1," + b64(expected)


def test_the_secret_regexes_are_written_out_identically():
    source = function_source("pgmb.secret_problem(text)")
    assert request.WHSEC_PATTERN in source
    assert request.SECRET_CONTROL in source


def test_a_bad_secret_from_before_the_rule_is_reported_clearly():
    # As an upgrade finds it: written while nothing checked it (triggers off).
    execute("SET LOCAL session_replication_role = replica")
    execute(
        "INSERT INTO pgmb_worker (name, endpoint, rps, secret)"
        " VALUES ('legacy', 'http://a/', 1, 'whsec_topsecret')"
    )
    execute("SET LOCAL session_replication_role = origin")

    refused = sql("SELECT pgmb.secret_key(secret) FROM pgmb_worker WHERE name = 'legacy'", ())
    assert refused[0] is False
    message = str(refused[1])
    assert "invalid worker secret" in message and "cut short" in message
    assert "base64 end sequence" not in message
    assert "whsec_topsecret" not in message
    signing = sql(
        "SELECT pgmb.request_headers(ROW(1, gen_random_uuid(), 1, 1, gen_random_uuid(), 'q',"
        " gen_random_uuid(), 'k', '{}', '{}'::jsonb, now(), w.id, w.endpoint, 1, ARRAY[w.secret],"
        " 1, 60)::pgmb.claimed, 1) FROM pgmb_worker w WHERE w.name = 'legacy'",
        (),
    )
    assert signing[0] is False and "invalid worker secret" in str(signing[1])
    with pytest.raises(ValueError, match="invalid worker secret"):
        request.secret_key("whsec_topsecret")
    # The row keeps working (claims update its tokens) until its secret is changed, and a
    # change must follow the rule.
    execute("UPDATE pgmb_worker SET tokens = 1, rps = 2 WHERE name = 'legacy'")
    changed = sql("UPDATE pgmb_worker SET secret = 'whsec_a' WHERE name = 'legacy' RETURNING 1", ())
    assert changed[0] is False and "invalid secret for worker legacy" in str(changed[1])
    assert sql("UPDATE pgmb_worker SET secret = 'whsec_YQ' WHERE name = 'legacy' RETURNING 1", ())


# ---- delays -------------------------------------------------------------------------

#: Seconds from now to the end of the year 9999, give or take the test's run time.
_TO_YEAR_10000 = (
    datetime(10000 - 1, 12, 31, 23, 59, 59, tzinfo=timezone.utc) - datetime.now(timezone.utc)
).total_seconds()

# (seconds, accepted?)
DELAYS = [
    (0, True),
    (0.0, True),
    (-0.0, True),
    (1.5, True),
    (86400, True),
    (2**31 - 1, True),
    (_TO_YEAR_10000 - 86400, True),  # a day inside the year 9999
    (_TO_YEAR_10000 + 86400, False),  # a day into the year 10000
    (1e300, False),
    (math.inf, False),
    (-math.inf, False),
    (math.nan, False),
    (-1, False),
    (-0.001, False),
]


@pytest.mark.parametrize(("seconds", "accepted"), DELAYS)
def test_delays(seconds, accepted):
    py = python(durations.check_seconds, seconds)
    db = sql("SELECT pgmb.check_delay(%s::float8)", (seconds,))
    same_verdict(py, db, seconds)
    assert py[0] is accepted
    if accepted:
        assert py[1] == db[1]
    else:
        assert isinstance(py[1], InvalidDelay)
        assert "invalid delay" in str(db[1])
    # pgmb.send() refuses the same delays, with InvalidDelay and before the database.
    if accepted:
        pgmb.send("delay.rule", 1, delay=seconds)
    else:
        with pytest.raises(InvalidDelay):
            pgmb.send("delay.rule", 1, delay=seconds)
        with pytest.raises(InvalidDelay):
            pgmb.send_batch([pgmb.Outgoing("delay.rule", 1, delay=seconds)])


@pytest.mark.parametrize("seconds", [-1, 0, 30, 2**31 - 1])
def test_the_sql_send_with_integer_seconds_applies_the_delay_rule(seconds):
    py = python(durations.check_seconds, seconds)
    db = sql("SELECT pgmb.send(gen_random_uuid(), 'a', '{}', '{}', %s::integer)", (seconds,))
    same_verdict(py, db, seconds)


def test_send_with_an_overlong_delay_is_invalid_delay_not_a_database_error():
    with pytest.raises(InvalidDelay, match="too long"):
        pgmb.send("a", 1, delay=1e300)
    with pytest.raises(InvalidDelay, match="too long"):
        pgmb.send("a", 1, delay=timedelta(days=999_999_999))


# ---- Retry-After ----------------------------------------------------------------------

#: Stands for an IMF-fixdate an hour from when the test runs.
IN_AN_HOUR = "<an IMF-fixdate an hour from now>"

# (header value, expected seconds: None for no value, "soon" for about an hour)
RETRY_AFTERS = [
    ("120", 120.0),
    (" 7 ", 7.0),
    ("\t7\t", 7.0),
    ("0", 0.0),
    ("007", 7.0),
    ("99999999999", 99999999999.0),
    ("9" * 400, None),  # too large for a float
    ("²", None),  # str.isdigit() says yes
    ("٣", None),  # an Arabic-Indic digit
    ("\uff12", None),  # a fullwidth digit
    ("1.5", None),
    ("-1", None),
    ("+1", None),
    ("1e3", None),
    ("1 2", None),
    ("12\n", None),
    ("\u00a012", None),
    ("", None),
    ("  ", None),
    (None, None),
    ("tomorrow", None),
    ("now", None),
    ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0),  # in the past: no wait
    (" Sun, 06 Nov 1994 08:49:37 GMT ", 0.0),
    (IN_AN_HOUR, 3600.0),
    ("Fri, 31 Dec 9999 23:59:59 GMT", "far"),
    ("Sunday, 06-Nov-94 08:49:37 GMT", None),  # RFC 850
    ("Sun Nov  6 08:49:37 1994", None),  # asctime
    ("Sun, 06 Nov 1994 08:49:37 UTC", None),
    ("Sun, 06 Nov 1994 08:49:37 +0000", None),
    ("sun, 06 nov 1994 08:49:37 gmt", None),  # IMF-fixdate is case-sensitive
    ("Sun, 6 Nov 1994 08:49:37 GMT", None),
    ("Mon, 31 Feb 2100 00:00:00 GMT", None),  # no such day
    ("Mon, 00 Jan 2100 00:00:00 GMT", None),
    ("Sun, 06 Nov 0000 08:49:37 GMT", None),  # no year 0
    ("Sun, 06 Nov 1994 24:00:00 GMT", None),
    ("Sun, 06 Nov 1994 23:59:60 GMT", None),
    ("Sun, 06 Nov 1994 23:60:00 GMT", None),
    ("Sun, 06 Nov 1994 08:49:37 GMT\n", None),
]


@pytest.mark.parametrize(("value", "expected"), RETRY_AFTERS)
def test_retry_after(value, expected):
    if value == IN_AN_HOUR:
        value = format_datetime(datetime.now(timezone.utc) + timedelta(hours=1), usegmt=True)
    py = client.parse_retry_after(value)
    ok, db = sql("SELECT pgmb.retry_after_seconds(%s)", (value,))
    assert ok, db  # never an error
    assert (py is None) == (db is None), f"{value!r}: Python {py!r}, SQL {db!r}"
    if expected is None:
        assert py is None
    elif expected == "far":
        assert py > 200 * 365 * 86400 and abs(py - db) <= 1
    else:
        assert py >= 0 and db >= 0
        assert abs(py - db) <= 1, f"{value!r}: Python {py}, SQL {db}"
        assert abs(py - expected) <= 5


def test_the_retry_after_regex_is_written_out_identically():
    assert client.RETRY_AFTER_PATTERN in function_source("pgmb.retry_after_seconds(text)")


def test_the_routing_key_check_is_inlined():
    """The CHECK of every published message is planned as its expression, not as calls of
    SQL functions (~13 us a row more; pgmb/sql/schema/routing.sql). A STRICT function whose
    body is not strict, an AND for instance, is never inlined."""
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (VERBOSE, FORMAT JSON)"
            " SELECT pgmb.valid_routing_key(routing_key) FROM pgmb_message"
        )
        (plan,) = cursor.fetchone()
        node = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
        # pgmb_message is partitioned (decision 0076): an Append of its partitions' scans,
        # each with the expression.
        while "Output" not in node:
            node = node["Plans"][0]
        output = node["Output"]
        cursor.execute("SELECT pgmb.valid_routing_key(NULL), pgmb.valid_key(NULL)")
        assert cursor.fetchone() == (None, None)  # as when they were STRICT
    assert "valid_" not in " ".join(output), output
    assert "!~" in " ".join(output)


# ---- a cap on requests in flight ----------------------------------------------------


def _clean_max_in_flight(value: int | None) -> int | None:
    return models.Worker._meta.get_field("max_in_flight").clean(value, models.Worker())


@pytest.mark.parametrize(
    ("cap", "accepted"),
    [
        (None, True),
        (1, True),
        (2, True),
        (2**31 - 1, True),
        (0, False),
        (-1, False),
        (-(2**31), False),
    ],
)
def test_max_in_flight(cap, accepted):
    py = python(_clean_max_in_flight, cap)
    db = sql(
        "INSERT INTO pgmb_worker (name, endpoint, rps, max_in_flight)"
        " VALUES ('cap_rule', 'http://a/', 1, %s) RETURNING max_in_flight",
        (cap,),
    )
    same_verdict(py, db, cap)
    assert py[0] is accepted
    if not accepted:
        assert f"invalid max_in_flight {cap} for worker cap_rule" in str(db[1])
