"""The body and header rule (pgmb/message_limits.py): one table of cases through Python
(``body_problem``/``headers_problem``, what pgmb.send and send_batch check) and SQL
(``pgmb.message_problem``, what the routing trigger checks for every writer), then each
write path: Python send and send_batch, SQL pgmb.send, a plain INSERT, COPY.

Issue 21: producers set ``Authorization`` or ``X-Forwarded-For`` on the worker's request,
a body nested 5,000 deep broke the admin, 10,000 headers made a 1 MB request head."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

import pgmb
from pgmb import message_limits
from pgmb import worker_request as request
from pgmb.errors import InvalidBody
from pgmb.models import Delivery, Message

pytestmark = pytest.mark.django_db


def nested(depth: int, leaf: Any = 1) -> Any:
    """``depth`` containers, alternating arrays and objects, around ``leaf``."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


KIB = 1024
# (body, headers, accepted?)
CASES: list[tuple[Any, dict, bool]] = [
    (1, {}, True),
    ("text", {}, True),
    ({}, {}, True),
    (nested(64), {}, True),
    (nested(64, []), {}, False),  # the empty array is a 65th container
    (nested(64, {}), {}, False),
    (nested(65), {}, False),
    (nested(62, [1, {"a": 2}]), {}, True),
    (nested(63, [1, {"a": 2}]), {}, False),
    (nested(300), {}, False),
    ([[1], [[2]], {"a": {"b": {"c": nested(60)}}}], {}, True),
    ([[1], [[2]], {"a": {"b": {"c": nested(61)}}}], {}, False),
    # Headers nest as deep as the body, counting the headers object.
    (1, {"h": nested(63)}, True),
    (1, {"h": nested(64)}, False),
    (1, {"h": nested(500)}, False),  # well within the header size
    # Header count.
    (1, {f"h{i}": "v" for i in range(64)}, True),
    (1, {f"h{i}": "v" for i in range(65)}, False),
    # Header size: name + value, in UTF-8 bytes; a value that is not a string as JSON.
    (1, {"h": "x" * (8 * KIB - 1)}, True),
    (1, {"h": "x" * (8 * KIB)}, False),
    (1, {"h": "é" * (4 * KIB - 1)}, True),  # 2 bytes each: 8191 with the name
    (1, {"h": "é" * (4 * KIB)}, False),
    (1, {"h": ["x" * (8 * KIB - 5)]}, True),  # ["…"] adds 4
    (1, {"h": ["x" * (8 * KIB - 4)]}, False),
    (1, {f"h{i}": "x" * (8 * KIB - 2) for i in range(4)}, True),  # 32768 in all
    (1, {f"h{i}": "x" * (8 * KIB - 2) for i in range(4)} | {"h4": ""}, False),  # 32770
    # Reserved names, any case; near misses pass.
    (1, {"tenant": "eu", "X-Request-Id": "r1", "count": 3}, True),
    (1, {"Authorization": "Bearer stolen"}, False),
    (1, {"authorization": "Bearer stolen"}, False),
    (1, {"Proxy-Authorization": "Basic x"}, False),
    (1, {"Cookie": "session=1"}, False),
    (1, {"Forwarded": "for=10.0.0.1"}, False),
    (1, {"X-Forwarded-For": "10.0.0.1"}, False),
    (1, {"x-forwarded-host": "admin.internal"}, False),
    (1, {"Content-Encoding": "gzip"}, False),
    (1, {"Host": "other"}, False),
    (1, {"Content-Length": "0"}, False),
    (1, {"Transfer-Encoding": "chunked"}, False),
    (1, {"Content-Type": "text/plain"}, False),
    (1, {"User-Agent": "me"}, False),
    (1, {"pgmb-queue": "spoofed"}, False),
    (1, {"PGMB-Attempt": "9"}, False),
    (1, {"webhook-signature": "v1,forged"}, False),
    # What proxies and frameworks trust besides X-Forwarded-*: the client's address, the
    # proxies passed, the method or URL to act on instead (issue 26).
    (1, {"X-Forwarded": "for=10.0.0.1"}, False),
    (1, {"X-Real-IP": "10.0.0.1"}, False),
    (1, {"True-Client-IP": "10.0.0.1"}, False),
    (1, {"x-client-ip": "10.0.0.1"}, False),
    (1, {"CF-Connecting-IP": "10.0.0.1"}, False),
    (1, {"Via": "1.1 internal-proxy"}, False),
    (1, {"X-HTTP-Method-Override": "DELETE"}, False),
    (1, {"X-HTTP-Method": "DELETE"}, False),
    (1, {"X-Method-Override": "DELETE"}, False),
    (1, {"X-Original-URL": "/admin"}, False),
    (1, {"X-Rewrite-URL": "/admin"}, False),
    (1, {"X-Forwardedx": "1"}, True),  # not a prefix match: no dash after it
    (1, {"Vias": "x"}, True),
    (1, {"X-Real-IPs": "x"}, True),
    (1, {"Authorizations": "x"}, True),
    (1, {"Cookies": "x"}, True),
]


def _python(body: Any, headers: dict) -> bool:
    return (
        message_limits.body_problem(body) is None
        and message_limits.headers_problem(headers) is None
    )


def _sql(body: Any, headers: dict) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pgmb.message_problem(%s::jsonb, %s::jsonb), "
            "pgmb.acceptable_message(%s::jsonb, %s::jsonb)",
            (json.dumps(body), json.dumps(headers)) * 2,
        )
        problem, acceptable = cursor.fetchone()
    assert (problem is None) is acceptable, problem
    return problem is None


def _id(case: tuple[Any, dict, bool]) -> str:
    return f"{json.dumps(case[0])[:20]}|{json.dumps(case[1])[:40]}"


@pytest.mark.parametrize(("body", "headers", "accepted"), CASES, ids=[_id(c) for c in CASES])
def test_python_and_sql_give_the_same_verdict(body, headers, accepted):
    assert _python(body, headers) is accepted
    assert _sql(body, headers) is accepted


def test_the_reserved_names_are_one_list_on_both_sides():
    names = sorted(request.RESERVED) + [p + "x" for p in request.RESERVED_PREFIXES]
    names += [n.upper() for n in names] + ["x-forwarded", "pgmb", "webhook", "tenant", "te-x"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT n, pgmb.reserved_header(n) FROM unnest(%s::text[]) AS n", (names,))
        in_sql = dict(cursor.fetchall())
        # The delivery side drops them with the same function (pgmb.run_headers).
        cursor.execute("SELECT prosrc FROM pg_proc WHERE oid = 'pgmb.run_headers'::regproc")
        assert "NOT pgmb.reserved_header(e.key)" in cursor.fetchone()[0]
    assert in_sql == {n: request.reserved_header(n) for n in names}


def test_python_checks_depth_without_recursing():
    deep = nested(5000)
    assert "max_depth" in (message_limits.body_problem(deep) or "")
    with pytest.raises(InvalidBody, match="max_depth"):
        pgmb.send("k", deep)


# ---- every write path --------------------------------------------------------------

BAD = [
    (nested(65), {}, "pgmb_message_body_valid", "max_depth"),
    (1, {f"h{i}": "v" for i in range(10_000)}, "pgmb_message_headers_valid", "max_headers"),
    (1, {"h": "x" * 9000}, "pgmb_message_headers_valid", "max_header_bytes"),
    (1, {"Authorization": "Bearer x"}, "pgmb_message_headers_valid", "reserved"),
    (1, {"X-Forwarded-For": "10.0.0.1"}, "pgmb_message_headers_valid", "reserved"),
]


def _refused_by(statement: str, params: Any, constraint: str, words: str) -> None:
    with pytest.raises(Exception) as caught, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement, params)
    cause = caught.value if isinstance(caught.value, psycopg.Error) else caught.value.__cause__
    assert isinstance(cause, psycopg.Error), caught.value
    assert (cause.sqlstate, cause.diag.constraint_name) == ("23514", constraint)
    assert words in cause.diag.message_primary


@pytest.mark.parametrize(("body", "headers", "constraint", "words"), BAD)
def test_every_write_path_refuses_and_writes_nothing(make_queue, body, headers, constraint, words):
    make_queue("#")
    b, h = json.dumps(body), json.dumps(headers)
    with pytest.raises(InvalidBody, match=words):
        pgmb.send("k", body, headers=headers)
    # A batch with one bad message writes none of them.
    with pytest.raises(InvalidBody, match=words):
        pgmb.send_batch([("k", 1), pgmb.Outgoing("k", body, headers=headers)])
    _refused_by(
        "SELECT pgmb.send(gen_random_uuid(), 'k', %s::jsonb, %s::jsonb)", (b, h), constraint, words
    )
    _refused_by(
        "INSERT INTO pgmb_message (id, routing_key, body, headers) VALUES "
        "(gen_random_uuid(), 'k', '1', '{}'), (gen_random_uuid(), 'k', %s::jsonb, %s::jsonb)",
        (b, h),
        constraint,
        words,
    )
    with pytest.raises(psycopg.errors.CheckViolation, match=words), transaction.atomic():
        raw = connection.connection
        assert raw is not None
        copy_in = "COPY pgmb_message (id, routing_key, body, headers) FROM STDIN"
        with raw.cursor() as cursor, cursor.copy(copy_in) as copy:
            copy.write_row((uuid.uuid4(), "k", "1", "{}"))
            copy.write_row((uuid.uuid4(), "k", b, h))
    assert Message.objects.count() == 0 and Delivery.objects.count() == 0


def test_what_passes_is_published_with_its_headers(make_queue):
    make_queue("#")
    headers = {f"h{i}": "v" for i in range(64)}
    mid = pgmb.send("k", nested(64), headers=headers)
    assert Message.objects.get(id=mid).headers == headers
    assert Delivery.objects.filter(message_id=mid).count() == 1


@pytest.mark.parametrize(("body", "headers", "constraint", "words"), BAD)
def test_an_update_is_held_to_the_same_limits(make_queue, body, headers, constraint, words):
    """Issue 26: the limits held for INSERT and COPY only; an UPDATE by a role that may
    write the table (pgmb_admin, the owner) stored what publishing refuses."""
    make_queue("#")
    mid = pgmb.send("k", {"n": 1}, headers={"tenant": "a"})
    b, h = json.dumps(body), json.dumps(headers)
    column, value = ("body", b) if constraint == "pgmb_message_body_valid" else ("headers", h)
    _refused_by(
        f"UPDATE pgmb_message SET {column} = %s::jsonb WHERE id = %s",
        (value, mid),
        constraint,
        words,
    )
    stored = Message.objects.get(id=mid)
    assert (stored.body, stored.headers) == ({"n": 1}, {"tenant": "a"})
    # An update within the limits goes through.
    with connection.cursor() as cursor:
        cursor.execute('UPDATE pgmb_message SET headers = \'{"tenant": "b"}\' WHERE id = %s', [mid])
    assert Message.objects.get(id=mid).headers == {"tenant": "b"}
