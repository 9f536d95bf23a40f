"""One header rule, two sides: the ``pgmb-routing-key`` header of a routing key, as
:func:`pgmb.worker_request.routing_key_header` (pgmb_dispatch) and
``pgmb.routing_key_header`` (the in-database loop, both transports) write it; and the mark
of a failure of pgmb's own, which the dispatchers write and ``pgmb.own_failure`` (the
circuit breaker) reads. One table of cases runs through both sides of each."""

from __future__ import annotations

from urllib.parse import unquote

import pytest
from django.db import connection

from pgmb import routing
from pgmb.dispatch.client import OWN_FAILURE, own_failure
from pgmb.worker_request import routing_key_header

pytestmark = pytest.mark.django_db

#: Routing keys (each one the key rule accepts) and their header value.
HEADERS = [
    ("order.created", "order.created"),
    ("a/b:c@d?e=f&g+h!$'(),;[]{}|\\^`\"<>~_-", "a/b:c@d?e=f&g+h!$'(),;[]{}|\\^`\"<>~_-"),
    ("c.zoé", "c.zo%C3%A9"),
    ("c.€", "c.%E2%82%AC"),
    ("c.100%", "c.100%25"),
    ("c.%C3%A9", "c.%25C3%25A9"),  # a key that looks encoded stays itself once decoded
    ("注文.作成", "%E6%B3%A8%E6%96%87.%E4%BD%9C%E6%88%90"),
    ("emoji.🎉", "emoji.%F0%9F%8E%89"),  # four UTF-8 bytes, outside the BMP
    ("ﬁ.Å", "%EF%AC%81.%C3%85"),  # no normalisation: the key's own code points
    ("a\u200bb", "a%E2%80%8Bb"),  # a zero-width space is no blank to the key rule
]


@pytest.mark.parametrize(("key", "header"), HEADERS)
def test_python_and_sql_write_the_same_header(key, header):
    assert routing.validate_routing_key(key) == key  # a message could have it
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgmb.routing_key_header(%s)", [key])
        ((in_sql,),) = cursor.fetchall()
    assert (routing_key_header(key), in_sql) == (header, header)
    assert header.isascii() and header.isprintable() and " " not in header
    assert unquote(header, errors="strict") == key  # a worker decodes it as it was sent


#: (status, error, a failure of pgmb's own?)
FAILURES = [
    (None, own_failure(1.0, "could not send the request: boom").error, True),
    (None, OWN_FAILURE + "connection failed: 10.0.0.1 resolves to …", True),
    (None, "connection failed: Connection refused (127.0.0.1:9)", False),
    (None, "timeout after 1s", False),
    (None, "HTTP request failed: pgmb's own failure: ", False),
    (None, "", False),
    (None, None, False),
    (500, OWN_FAILURE + "an answer has a status", False),
    (404, "HTTP 404: pgmb's own failure: ", False),
]


@pytest.mark.parametrize(("status", "error", "own"), FAILURES)
def test_the_breaker_knows_a_failure_of_pgmbs_own_by_what_the_dispatchers_write(status, error, own):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgmb.own_failure(%s, %s)", [status, error])
        ((in_sql,),) = cursor.fetchall()
    assert in_sql is own
