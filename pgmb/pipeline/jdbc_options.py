"""libpq's connection keywords as the PostgreSQL JDBC driver's URL and properties.

Spark's JDBC reads must connect the way libpq (psycopg, on the driver) does: a
``sslmode=verify-full`` connection string must not become a JDBC connection that
checks nothing. :data:`LIBPQ_TO_JDBC` is the one table of the keywords carried over;
a keyword that tightens security and has no JDBC equivalent is refused
(:data:`NO_JDBC_EQUIVALENT`) rather than silently dropped. Decision record 0036.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import quote

from ..errors import PipelineError

#: libpq keyword → the JDBC driver's property of the same meaning. The JDBC driver takes
#: libpq's sslmode values as they are (disable, allow, prefer, require, verify-ca,
#: verify-full) and, like libpq, reads the files named here on the machine it runs on.
LIBPQ_TO_JDBC: Mapping[str, str] = {
    "user": "user",
    "password": "password",
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "sslpassword": "sslpassword",
    "application_name": "ApplicationName",
    "connect_timeout": "connectTimeout",
    "options": "options",
}

#: libpq keywords (and the values of them, ``None``: any value) that ask for more
#: protection than the JDBC driver (42.5) can give: a read must not go ahead without it.
NO_JDBC_EQUIVALENT: Mapping[str, frozenset[str] | None] = {
    "sslcrl": None,
    "sslcrldir": None,
    "ssl_min_protocol_version": None,
    "ssl_max_protocol_version": None,
    "require_auth": None,
    "requirepeer": None,
    "channel_binding": frozenset({"require"}),
    "sslcertmode": frozenset({"require"}),
    "sslnegotiation": frozenset({"direct"}),
    "gssencmode": frozenset({"require"}),
}

#: libpq's default sslmode, made explicit so that both sides start from the same one.
DEFAULT_SSLMODE = "prefer"
#: The JDBC driver's factory that trusts the JVM's CA store: libpq's ``sslrootcert=system``.
SYSTEM_CA_FACTORY = "org.postgresql.ssl.DefaultJavaSSLFactory"


def jdbc_url(params: Mapping[str, str]) -> str:
    """``jdbc:postgresql://host:port/dbname``: TCP hosts (JDBC cannot use a Unix socket),
    IPv6 addresses in brackets, the database name percent-encoded."""
    hosts = (params.get("host") or "localhost").split(",")
    ports = (params.get("port") or "5432").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    if len(ports) != len(hosts):
        raise PipelineError(f"{len(hosts)} hosts but {len(ports)} ports in the connection string")
    where = []
    for host, port in zip(hosts, ports, strict=True):
        host = host or "localhost"
        if host.startswith("/"):
            raise PipelineError(
                f"database host {host!r} is a Unix socket folder; Spark's JDBC driver "
                "needs a TCP host (set host=127.0.0.1 or a name)"
            )
        where.append(f"[{host}]:{port or '5432'}" if ":" in host else f"{host}:{port or '5432'}")
    dbname = params.get("dbname") or params.get("user") or ""
    return f"jdbc:postgresql://{','.join(where)}/{quote(dbname, safe='')}"


def jdbc_properties(params: Mapping[str, str]) -> dict[str, str]:
    """The JDBC driver's properties (and Spark's ``driver`` option) for ``params``."""
    for keyword, refused in NO_JDBC_EQUIVALENT.items():
        value = params.get(keyword)
        if value and (refused is None or value in refused):
            raise PipelineError(
                f"the connection sets {keyword}={value}, which Spark's JDBC driver cannot "
                f"honour; remove it to run the pipeline (docs/pipeline.md#tls)"
            )
    props = {"driver": "org.postgresql.Driver", "sslmode": DEFAULT_SSLMODE}
    props.update({LIBPQ_TO_JDBC[k]: v for k, v in params.items() if k in LIBPQ_TO_JDBC and v})
    rootcert = params.get("sslrootcert")
    if rootcert == "system":
        # libpq checks the server against the system's CAs, and only in verify-full.
        del props["sslrootcert"]
        props["sslfactory"] = SYSTEM_CA_FACTORY
        props["sslmode"] = "verify-full"
    elif props["sslmode"] == "require" and rootcert and os.path.isfile(rootcert):
        # libpq verifies the server's certificate in "require" when it has a root
        # certificate; the JDBC driver would not.
        props["sslmode"] = "verify-ca"
    return props
