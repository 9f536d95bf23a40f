"""PGMB["ENDPOINT_POLICY"] on the external dispatcher's client: the check is on the address
connected to, after name resolution, and a refused address gets no packet.

Only loopback addresses ever receive traffic here: the policies deny 127.0.0.2 and allow
127.0.0.1, which gives real allowed and refused addresses; 169.254.169.254 is refused before
any socket is made."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from pgmb import conf
from pgmb.dispatch.client import new_session, post
from tests.httpserver import RecordingServer

DENY_127_0_0_2 = {"ENDPOINT_POLICY": {"allow": ["127.0.0.1/32"], "deny": ["127.0.0.2/32"]}}


def send(loop, session, url: str) -> tuple:
    outcome = loop.run_until_complete(
        post(session, url, json.dumps({"n": 1}).encode(), {}, 2.0, 500)
    )
    return outcome.status, outcome.error


@pytest.fixture
def pair():
    """Servers on 127.0.0.1 and 127.0.0.2, on the same port."""
    allowed = RecordingServer("127.0.0.1").start()
    try:
        denied = RecordingServer("127.0.0.2", allowed.port).start()
    except OSError:
        allowed.stop()
        pytest.skip("the port is taken on 127.0.0.2")
    yield allowed, denied
    denied.stop()
    allowed.stop()


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_link_local_is_refused_by_default_before_connecting(loop, settings):
    settings.PGMB = {}
    session = new_session(4)
    status, error = send(loop, session, "http://169.254.169.254/latest/meta-data/")
    loop.run_until_complete(session.close())
    assert status is None
    assert error == (
        "pgmb's own failure: connection failed: 169.254.169.254 resolves to 169.254.169.254, "
        "which PGMB['ENDPOINT_POLICY'] refuses"
    )


def test_a_denied_address_literal_gets_no_request(loop, settings, pair):
    allowed, denied = pair
    settings.PGMB = DENY_127_0_0_2
    session = new_session(4)
    assert send(loop, session, allowed.url("/a"))[0] == 200
    status, error = send(loop, session, denied.url("/b"))
    loop.run_until_complete(session.close())
    assert status is None and "127.0.0.2" in error and "refuses" in error
    assert [r.path for r in allowed.requests] == ["/a"]
    assert denied.requests == []


def test_an_answer_that_changes_is_checked_at_each_connect(loop, settings, pair):
    allowed, denied = pair
    settings.PGMB = DENY_127_0_0_2
    real = loop.getaddrinfo
    answers = iter(["127.0.0.1"])

    async def getaddrinfo(host, port, **kwargs):
        if host == "rebind.pgmb.test":
            host = next(answers, "127.0.0.2")
        return await real(host, port, **kwargs)

    loop.getaddrinfo = getaddrinfo  # the name's DNS answer, for this loop only
    url = f"http://rebind.pgmb.test:{allowed.port}/hook"
    session = new_session(4)
    assert send(loop, session, url)[0] == 200
    loop.run_until_complete(session.close())  # the next request connects anew

    status, error = send(loop, session, url)
    loop.run_until_complete(session.close())

    assert status is None
    assert error == (
        "pgmb's own failure: connection failed: rebind.pgmb.test resolves to 127.0.0.2, "
        "which PGMB['ENDPOINT_POLICY'] refuses"
    )
    assert len(allowed.requests) == 1 and denied.requests == []


def test_of_several_addresses_only_the_allowed_are_tried(loop, settings, pair):
    allowed, denied = pair
    settings.PGMB = {"ENDPOINT_POLICY": {"deny": ["127.0.0.2/32"]}}

    async def getaddrinfo(host, port, **kwargs):
        # The refused address first: it would win a race it were allowed to enter.
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]

    loop.getaddrinfo = getaddrinfo
    session = new_session(4)
    status, _ = send(loop, session, f"http://two.pgmb.test:{allowed.port}/x")
    loop.run_until_complete(session.close())
    assert status == 200
    assert len(allowed.requests) == 1 and denied.requests == []


def test_several_allowed_addresses_are_raced(loop, settings, pair):
    allowed, _ = pair
    settings.PGMB = {"ENDPOINT_POLICY": {"deny": ["127.0.0.2/32"]}}

    async def getaddrinfo(host, port, **kwargs):
        # Nothing listens on 127.0.0.3: its attempt fails, the next one connects.
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.3", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]

    loop.getaddrinfo = getaddrinfo
    session = new_session(4)
    status, _ = send(loop, session, f"http://two.pgmb.test:{allowed.port}/x")
    loop.run_until_complete(session.close())
    assert status == 200 and len(allowed.requests) == 1


# --- one rule in Python (pgmb.endpoint_policy) and SQL (pgmb.endpoint_refused) ---------

# The presets themselves (pgmb.conf): the cases say what each must refuse.
UNTRUSTED = conf.UNTRUSTED_ENDPOINTS
DEFAULT = conf.DEFAULT_ENDPOINT_POLICY
CARVED = {"allow": ["10.1.0.0/16"], "deny": ["10.0.0.0/8"]}

CASES = [
    # (policy, address, refused)
    (DEFAULT, "169.254.169.254", True),
    (DEFAULT, "::ffff:169.254.169.254", True),
    (DEFAULT, "fe80::1", True),
    (DEFAULT, "127.0.0.1", False),
    (DEFAULT, "10.2.3.4", False),
    (DEFAULT, "93.184.216.34", False),
    # Issue 26, item 15: metadata services outside link-local, and link-local and the
    # metadata services through NAT64 and 6to4.
    (DEFAULT, "fd00:ec2::254", True),
    (DEFAULT, "100.100.100.200", True),
    (DEFAULT, "64:ff9b::169.254.169.254", True),
    (DEFAULT, "64:ff9b::100.100.100.200", True),
    (DEFAULT, "2002:a9fe:a9fe::1", True),
    (DEFAULT, "2002:6464:64c8::1", True),
    (DEFAULT, "64:ff9b::93.184.216.34", False),  # NAT64 to a public address
    (DEFAULT, "2002:5db8:d822::1", False),
    (DEFAULT, "fd00:ec2::253", False),  # a private address, as 10.0.0.0/8 is
    (UNTRUSTED, "fd00:ec2::254", True),
    (UNTRUSTED, "100.100.100.200", True),
    (UNTRUSTED, "64:ff9b::127.0.0.1", True),
    (UNTRUSTED, "64:ff9b::10.0.0.1", True),
    (UNTRUSTED, "64:ff9b:1::a00:1", True),  # local-use NAT64 (RFC 8215)
    (UNTRUSTED, "2002:7f00:1::1", True),
    (UNTRUSTED, "2002:c0a8:101::1", True),
    (UNTRUSTED, "127.0.0.1", True),
    (UNTRUSTED, "127.0.0.2", True),
    (UNTRUSTED, "::1", True),
    (UNTRUSTED, "::ffff:127.0.0.1", True),
    (UNTRUSTED, "10.2.3.4", True),
    (UNTRUSTED, "172.31.255.255", True),
    (UNTRUSTED, "172.32.0.1", False),
    (UNTRUSTED, "192.168.1.1", True),
    (UNTRUSTED, "fd12::1", True),
    (UNTRUSTED, "2606:4700::1", False),
    (UNTRUSTED, "93.184.216.34", False),
    (CARVED, "10.1.2.3", False),
    (CARVED, "10.2.3.4", True),
    (CARVED, "127.0.0.1", False),
]


@pytest.mark.parametrize("policy, address, refused", CASES)
def test_the_rule_is_one_in_python_and_sql(sql, policy, address, refused):
    from pgmb.endpoint_policy import Policy

    assert Policy.from_setting(policy).refuses(address) is refused
    [(in_sql,)] = sql(
        "SELECT pgmb.endpoint_refused(%s::inet, %s::cidr[], %s::cidr[])",
        (address, policy["allow"], policy["deny"]),
    )
    assert in_sql is refused


def test_the_untrusted_preset_refuses_what_the_docs_say():
    from pgmb.endpoint_policy import Policy

    preset = Policy.from_setting(conf.UNTRUSTED_ENDPOINTS)
    for address, refused in [(a, r) for p, a, r in CASES if p is UNTRUSTED]:
        assert preset.refuses(address) is refused, address


# --- the PL/Python transport -------------------------------------------------------------


@pytest.fixture
def plpython(sql):
    """pgmb.post_via_plpython on the test's connection: (status, error)."""
    [(present,)] = sql(
        "SELECT to_regprocedure('pgmb.post_via_plpython(text, text, jsonb, float8)') IS NOT NULL"
    )
    if not present:
        pytest.skip("plpython3u is not installed in the test database")

    def post(url: str, timeout: float = 2.0) -> tuple:
        [row] = sql(
            "SELECT (o).status, (o).error FROM (SELECT pgmb.post_via_plpython(%s, '{}', '{}', %s)"
            " AS o) AS s",
            (url, timeout),
        )
        return row

    return post


def store_policy(sql, policy) -> None:
    sql(
        "UPDATE pgmb.endpoint_policy SET allow = %s::cidr[], deny = %s::cidr[]",
        (policy["allow"], policy["deny"]),
    )


def test_plpython_refuses_link_local_by_default_before_connecting(plpython):
    status, error = plpython("http://169.254.169.254/latest/meta-data/")
    assert status is None
    assert error == (
        "pgmb's own failure: connection failed: 169.254.169.254 resolves to 169.254.169.254, "
        "which the endpoint policy (pgmb.endpoint_policy) refuses"
    )


def test_plpython_connects_only_to_allowed_addresses(sql, plpython, pair):
    allowed, denied = pair
    store_policy(sql, DENY_127_0_0_2["ENDPOINT_POLICY"])
    assert plpython(allowed.url("/a"))[0] == 200
    status, error = plpython(denied.url("/b"))
    assert status is None and "127.0.0.2" in error and "refuses" in error
    assert [r.path for r in allowed.requests] == ["/a"] and denied.requests == []


@pytest.fixture
def backend_rebinding(sql):
    """In the test's backend, name resolution of rebind.pgmb.test answers 127.0.0.1 once,
    then 127.0.0.2 (PL/Python's socket module is the backend's, shared by its functions)."""
    sql("""DO $$
import socket
real = socket.getaddrinfo
answers = iter(["127.0.0.1"])
def getaddrinfo(host, port, *args, **kwargs):
    if host == "rebind.pgmb.test":
        host = next(answers, "127.0.0.2")
    return real(host, port, *args, **kwargs)
GD["pgmb_test_real_getaddrinfo"] = real
socket.getaddrinfo = getaddrinfo
$$ LANGUAGE plpython3u""")
    yield
    sql("""DO $$
import socket
socket.getaddrinfo = GD.pop("pgmb_test_real_getaddrinfo")
$$ LANGUAGE plpython3u""")


def test_plpython_checks_the_answer_of_each_connect(sql, plpython, pair, backend_rebinding):
    allowed, denied = pair
    store_policy(sql, DENY_127_0_0_2["ENDPOINT_POLICY"])
    url = f"http://rebind.pgmb.test:{allowed.port}/hook"
    # A server closing the first connection makes the second request connect anew.
    allowed.respond(200, headers={"Connection": "close"})
    assert plpython(url)[0] == 200

    status, error = plpython(url)

    assert status is None
    assert error == (
        "pgmb's own failure: connection failed: rebind.pgmb.test resolves to 127.0.0.2, "
        "which the endpoint policy (pgmb.endpoint_policy) refuses"
    )
    assert len(allowed.requests) == 1 and denied.requests == []


# --- pgsql-http cannot enforce a policy ---------------------------------------------------


@pytest.fixture
def http_extension(sql):
    [(available,)] = sql("SELECT count(*) FROM pg_available_extensions WHERE name = 'http'")
    if not available:
        pytest.skip("the http stand-in is not installed (tests/pg_http/install.sh)")
    sql("CREATE EXTENSION IF NOT EXISTS http CASCADE")


def test_http_is_refused_under_a_restrictive_policy(sql, http_extension):
    [(default,)] = sql("SELECT pgmb.http_transport()")
    assert default == "http"
    store_policy(sql, UNTRUSTED)
    [(transport,)] = sql("SELECT pgmb.http_transport()")
    [(plpython,)] = sql(
        "SELECT to_regprocedure('pgmb.post_via_plpython(text, text, jsonb, float8)') IS NOT NULL"
    )
    if plpython:
        assert transport == "plpython3u"  # the transport that checks the policy
        sql("DROP FUNCTION pgmb.post_via_plpython(text, text, jsonb, float8)")
    with pytest.raises(Exception) as caught:
        sql("SELECT pgmb.post('http://127.0.0.1:9/', '{}', '{}', 1)")
    assert "the http extension cannot enforce PGMB['ENDPOINT_POLICY']" in str(caught.value)


# --- the setting, and the database's copy of it --------------------------------------------


@pytest.mark.parametrize(
    "value, problem",
    [
        ({"deny": ["10.0.0.1/8"]}, "PGMB['ENDPOINT_POLICY']['deny']: 10.0.0.1/8 has host bits set"),
        ({"allow": "10.0.0.0/8"}, "PGMB['ENDPOINT_POLICY']['allow'] must be a list of CIDR texts"),
        (
            {"refuse": []},
            "PGMB['ENDPOINT_POLICY'] takes the keys 'allow' and 'deny', not ['refuse']",
        ),
        (["10.0.0.0/8"], "PGMB['ENDPOINT_POLICY'] must be dict, got ['10.0.0.0/8']"),
    ],
)
def test_a_bad_policy_is_a_clear_error(value, problem):
    from pgmb import conf

    assert conf.errors({"ENDPOINT_POLICY": value}) == [problem]


def test_the_database_copy_is_written_and_checked(sql, settings):
    from django.db import connection

    from pgmb import indb
    from pgmb.checks import check_in_database_endpoint_policy

    assert check_in_database_endpoint_policy(databases=["default"]) == []
    settings.PGMB = DENY_127_0_0_2
    [warning] = check_in_database_endpoint_policy(databases=["default"])
    assert warning.id == "pgmb.W040"
    assert "pgmb_cron install" in warning.hint

    with connection.cursor() as cursor:
        indb.write_endpoint_policy(cursor)

    assert check_in_database_endpoint_policy(databases=["default"]) == []
    assert sql("SELECT allow::text[], deny::text[] FROM pgmb.endpoint_policy") == [
        (["127.0.0.1/32"], ["127.0.0.2/32"])
    ]
    [(refused,)] = sql("SELECT pgmb.endpoint_refused('127.0.0.2'::inet)")
    assert refused is True
