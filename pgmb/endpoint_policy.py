"""Which addresses an endpoint may reach (``PGMB["ENDPOINT_POLICY"]``, docs/security.md).

The rule: an address in an allowed network is reachable; else one in a denied network is
refused; else it is reachable. IPv4-mapped IPv6 addresses (``::ffff:169.254.169.254``) are
judged as the IPv4 address they carry. The PL/Python transport holds the same rule in its
own words (``pgmb.load_plpython_transport``); one table of cases runs both
(tests/security/test_endpoint_policy.py).

The check is made on the address a connection is made to, after name resolution, so a
name whose answer changes between a check and a connect (DNS rebinding) cannot reach a
refused address: the external dispatcher's client (pgmb.dispatch.http1, which also sends
the admin's test request) resolves, keeps the allowed addresses (:func:`allowed`) and
connects to those only. :func:`endpoint_problem` checks a worker's endpoint when it is
saved. The presets are in pgmb.conf (docs/decisions/0059-endpoint-presets.md).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from . import conf

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
AddrInfo = tuple[int, int, int, str, tuple]


class EndpointRefused(OSError):
    """The endpoint's name resolved to no address the policy allows."""


@dataclass(frozen=True)
class Policy:
    allow: tuple[Network, ...]
    deny: tuple[Network, ...]

    @classmethod
    def from_setting(cls, value: dict) -> Policy:
        return cls(
            tuple(ipaddress.ip_network(n) for n in value.get("allow", ())),
            tuple(ipaddress.ip_network(n) for n in value.get("deny", ())),
        )

    def refuses(self, address: str) -> bool:
        """Whether ``address`` (an IP address text, a scope id allowed) is refused."""
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in network for network in self.allow):
            return False
        return any(ip in network for network in self.deny)

    @property
    def is_default(self) -> bool:
        """Whether this is the default policy (the only one pgsql-http may run under)."""
        return self == Policy.from_setting(conf.DEFAULT_ENDPOINT_POLICY)


def current() -> Policy:
    """The policy of the current settings."""
    return Policy.from_setting(conf.get().ENDPOINT_POLICY)


def allowed(policy: Policy, host: str, infos: Iterable[AddrInfo]) -> list[AddrInfo]:
    """The addresses of ``infos`` the policy allows; :class:`EndpointRefused` if none."""
    infos = list(infos)
    kept = [info for info in infos if not policy.refuses(info[4][0])]
    if infos and not kept:
        addresses = ", ".join(sorted({info[4][0] for info in infos}))
        raise EndpointRefused(
            f"{host} resolves to {addresses}, which PGMB['ENDPOINT_POLICY'] refuses"
        )
    return kept


def endpoint_problem(url: str, policy: Policy | None = None) -> str | None:
    """Why a worker may not have ``url`` as its endpoint (an address the policy refuses),
    or None. A name that does not resolve now is not refused: the connect-time check
    still applies when it does."""
    policy = current() if policy is None else policy
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        return None
    try:
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError, UnicodeError):
        return None
    addresses = {str(info[4][0]) for info in infos}
    refused = sorted(address for address in addresses if policy.refuses(address))
    if refused:
        return (
            f"{host} resolves to {', '.join(refused)}, which PGMB['ENDPOINT_POLICY'] "
            "refuses (docs/security.md, Endpoints)"
        )
    return None
