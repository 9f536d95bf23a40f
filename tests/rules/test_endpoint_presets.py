"""The default endpoint policy has one list of networks in Python
(``pgmb.conf.DEFAULT_ENDPOINT_POLICY``) and one in SQL (``pgmb.default_endpoint_deny()``,
the in-database path's default until the setting is written): they are the same list, so
that the default written by ``migrate`` is recognised as the default (pgsql-http runs only
under it) and an unwritten row refuses what the setting refuses. What each preset refuses
is the table of tests/security/test_endpoint_policy.py."""

from __future__ import annotations

import ipaddress

import pytest
from django.db import connection

from pgmb import conf, indb

pytestmark = pytest.mark.django_db


def one(statement: str, params: tuple = ()) -> object:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone()[0]


def test_the_default_deny_list_is_the_same_in_python_and_sql():
    in_sql = one("SELECT pgmb.default_endpoint_deny()::text[]")
    assert in_sql == conf.DEFAULT_ENDPOINT_POLICY["deny"]
    assert conf.DEFAULT_ENDPOINT_POLICY["allow"] == []


def test_the_written_default_is_recognised_as_the_default():
    with connection.cursor() as cursor:
        indb.write_endpoint_policy(cursor)
    assert one("SELECT pgmb.endpoint_policy_is_default()") is True
    with connection.cursor() as cursor:
        assert indb.endpoint_policy_matches(cursor)


def test_an_unwritten_policy_refuses_what_the_default_refuses():
    one("DELETE FROM pgmb.endpoint_policy RETURNING 1")
    for network in conf.DEFAULT_ENDPOINT_POLICY["deny"]:
        address = str(ipaddress.ip_network(network)[-1])
        assert one("SELECT pgmb.endpoint_refused(%s::inet)", (address,)) is True, address
    assert one("SELECT pgmb.endpoint_refused('93.184.216.34'::inet)") is False


def test_the_translated_networks_carry_the_refused_ipv4_networks():
    """NAT64 (64:ff9b::/96) and 6to4 (2002::/16) networks of the default are exactly the
    IPv4 networks it refuses, embedded as RFC 6052 and RFC 3056 say."""
    ipv4 = [
        ipaddress.ip_network(n)
        for n in conf.DEFAULT_ENDPOINT_POLICY["deny"]
        if ipaddress.ip_network(n).version == 4
    ]
    nat64, six_to_four = ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("2002::/16")
    expected = set()
    for net in ipv4:
        first = int(net.network_address)
        expected.add(ipaddress.ip_network((int(nat64.network_address) + first, 96 + net.prefixlen)))
        expected.add(
            ipaddress.ip_network(
                (int(six_to_four.network_address) | first << 80, 16 + net.prefixlen)
            )
        )
    assert {ipaddress.ip_network(n) for n in conf.TRANSLATED_METADATA} == expected
